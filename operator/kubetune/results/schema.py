"""The tables, in SQLAlchemy Core: one schema for SQLite and PostgreSQL.

A metric is one row of ``metrics`` (not a JSON document) so that a float is a real
column value: PostgreSQL's double precision keeps NaN and ±Infinity; SQLite keeps
±Infinity but turns a bound NaN into NULL, so ``Double`` below stores NaN as NULL
there and ``kind`` tells a NaN from a missing value when reading."""
from __future__ import annotations

import math

from sqlalchemy import (BigInteger, Column, Double as _Double, Index, Integer, LargeBinary, MetaData,
                        PrimaryKeyConstraint, String, Table, Text, TypeDecorator)


class Double(TypeDecorator):
    impl = _Double
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and dialect.name == "sqlite" and math.isnan(value):
            return None
        return value


metadata = MetaData()

experiments = Table(
    "kubetune_experiments", metadata,
    Column("uid", String(64), primary_key=True),
    Column("namespace", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("metric", Text, nullable=False, default=""),
    Column("mode", String(8), nullable=False, default=""),
    Column("phase", String(32), nullable=False, default=""),
    Column("created", Double, nullable=False, default=0.0),
    # JSON of what a study view needs beyond one metric: {"objectives": [{"metric", "mode"}],
    # "constraints": [{"metric", "min", "max"}], "distributions": {param: Optuna's JSON}}.
    # Added after the first release: migrate.py adds it to an older database, "" there
    Column("study", Text, nullable=False, default="", server_default=""),
    Index("kubetune_experiments_by_name", "namespace", "name"),
)

trials = Table(
    "kubetune_trials", metadata,
    Column("uid", String(64), primary_key=True),
    Column("experiment_uid", String(64), nullable=False, index=True),
    Column("name", Text, nullable=False),
    Column("index", Integer, nullable=False, default=0),
    Column("params", Text, nullable=False, default="{}"),     # JSON
    Column("phase", String(32), nullable=False, default=""),
    Column("reason", Text, nullable=False, default=""),
    Column("best", Double),
    Column("iteration", BigInteger),
    Column("attempt", Integer, nullable=False, default=0),
)

results = Table(
    "kubetune_results", metadata,
    Column("trial_uid", String(64), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("iteration", BigInteger, nullable=False),
    Column("attempt", Integer),
    Column("time", Double, nullable=False, default=0.0),
    Column("checkpoint", Text),
    PrimaryKeyConstraint("trial_uid", "seq", name="kubetune_results_pk"),
)

# kind: f float, i int (exact digits in ``text``), b bool, s string (``text``), j other JSON
metrics = Table(
    "kubetune_metrics", metadata,
    Column("trial_uid", String(64), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("name", Text, nullable=False),
    Column("kind", String(1), nullable=False),
    Column("value", Double),
    Column("text", Text),
    PrimaryKeyConstraint("trial_uid", "seq", "name", name="kubetune_metrics_pk"),
)

# One row per trial: its objective's curve, kept by the writer with the results (curves.py:
# what it holds and when readers use it).  A table of its own: create_all adds it to an
# existing database, whose trials have no row and are read from ``metrics`` as before
curves = Table(
    "kubetune_curves", metadata,
    Column("trial_uid", String(64), primary_key=True),
    Column("metric", Text, nullable=False),
    Column("results", BigInteger, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("started", Double),
    Column("ended", Double),
    Column("overflow", Integer, nullable=False, default=0),
    Column("steps", LargeBinary, nullable=False),     # int64 little-endian, one per point
    Column("step_values", LargeBinary, nullable=False),    # float64 little-endian (NaN and ±Infinity kept)
    Column("last", Text),     # JSON: {"metrics": the study's, "values": the last result's numbers among them}
    Column("points_json", LargeBinary),   # the points as a study view's JSON (curves.encode_points), or NULL
    Column("points_crc", BigInteger),     # CRC-32 of steps, step_values and points_json (else it is not used)
)

# One row per attempt of a trial (issue 27): a table of its own, so an existing database
# gains it through create_all (no column added to a table that has rows: no migration)
usage = Table(
    "kubetune_usage", metadata,
    Column("trial_uid", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("started", Double, nullable=False),
    Column("ended", Double),
    Column("seen", Double, nullable=False),
    Column("run_seconds", Double, nullable=False, default=0.0),
    Column("gpu_seconds", Double, nullable=False, default=0.0),
    Column("cpu_seconds", Double, nullable=False, default=0.0),
    Column("queue_seconds", Double, nullable=False, default=0.0),
    PrimaryKeyConstraint("trial_uid", "attempt", name="kubetune_usage_pk"),
)

failures = Table(
    "kubetune_failures", metadata,
    Column("trial_uid", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("reason", Text, nullable=False, default=""),
    Column("message", Text, nullable=False, default=""),
    Column("time", Double, nullable=False, default=0.0),
    PrimaryKeyConstraint("trial_uid", "attempt", name="kubetune_failures_pk"),
)
