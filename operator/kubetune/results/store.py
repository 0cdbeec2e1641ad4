"""ResultsStore: the one interface to the results database, on SQLAlchemy.

Every write is an upsert keyed by identity (experiment UID, trial UID, (trial UID,
result seq), (trial UID, attempt)), so a batch written twice — a retry after a lost
connection, an operator restarted before it recorded how far it got — never
duplicates a row.  Results use "the newest delivery wins": a refetched result is the
same result, and a result seq reused by the run that replaced a lost one (operator
killed after this write but before the Trial's lastResultSeq) replaces the stale row.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from sqlalchemy import Engine, String, create_engine, delete, event, exists, func, inspect, select
from sqlalchemy.engine import make_url

from kubetune.results import curves as curve_rows, migrate, schema, values
from kubetune.results.rows import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow, UsageRow

URL_ENV = "KUBETUNE_RESULTS_URL"
CHUNK_ROWS = 5000   # rows per statement: bounds the memory of one executemany


def default_url() -> str:
    """``$KUBETUNE_RESULTS_URL``, else a SQLite file in the user's data directory."""
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV]
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return f"sqlite:///{base / 'kubetune' / 'results.db'}"


def open_store(url: str | None = None, *, create: bool = True, read_only: bool = False) -> "ResultsStore":
    """The store at ``url`` (default: ``default_url()``).  ``create=False`` (readers):
    a SQLite file that does not exist is an error rather than a new empty store.
    ``read_only`` (the dashboard): the database refuses writes (SQLite opened with
    mode=ro, PostgreSQL sessions read-only), no table is created nor migrated."""
    url = url or default_url()
    parsed = make_url(url)
    if (not create or read_only) and parsed.get_backend_name() == "sqlite" \
            and parsed.database not in (None, "", ":memory:") and not Path(parsed.database).expanduser().exists():
        raise FileNotFoundError(f"no results store at {parsed.database} "
                                "(`kubetune run` and the operator create it with their first result)")
    return ResultsStore(url, read_only=read_only)


def _engine(url: str, read_only: bool = False) -> Engine:
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")   # psycopg 3, not the default psycopg2
    if parsed.get_backend_name() == "sqlite" and read_only:
        # a WAL database opens read-only while its writer has it open (its -shm file exists)
        path = Path(parsed.database).expanduser().resolve()
        return create_engine(f"sqlite:///file:{path}?mode=ro&uri=true", connect_args={"timeout": 30})
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(connection, _record) -> None:
            # WAL: `kubetune results` reads while the operator writes
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()
        return engine
    # pre-ping: a restarted database server costs one failed batch, not a dead pool
    extra = {"connect_args": {"options": "-c default_transaction_read_only=on"}} if read_only else {}
    return create_engine(parsed, pool_pre_ping=True, pool_size=2, max_overflow=2, **extra)


def _storable(row: dict[str, Any], texts: Sequence[str]) -> dict[str, Any]:
    """``row`` with its text columns made storable (values.storable); the row itself when it
    needs nothing (the common case: copying every row of a large batch costs throughput)."""
    for name in texts:
        value = row.get(name)
        if value is not None and (not value.isascii() or "\x00" in value):
            return {k: values.storable(v) if isinstance(v, str) else v for k, v in row.items()}
    return row


def _insert(dialect: str):
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:
        raise ValueError(f"results store: unsupported database {dialect!r} (use sqlite or postgresql)")
    return insert


def _raw_rows(connection, query) -> list[tuple]:
    """The driver's own tuples of a SELECT, fetched in one call: a million rows (every
    result of a big Experiment) cost a third less without SQLAlchemy's Row per row."""
    compiled = query.compile(dialect=connection.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.params
    if compiled.positional:
        params = tuple(params[name] for name in compiled.positiontup)
    cursor = connection.connection.cursor()
    try:
        cursor.execute(str(compiled), params)
        return cursor.fetchall()
    finally:
        cursor.close()


class ResultsStore:
    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self.url = url
        self.read_only = read_only
        self.engine = _engine(url, read_only)
        self._insert = _insert(self.engine.dialect.name)
        if read_only:
            # a database an older kubetune wrote lacks newer columns: read what it has
            missing = migrate.missing_columns(self.engine)
            self._experiment_columns = [c for c in schema.experiments.columns
                                        if c.name not in missing.get(schema.experiments.name, [])]
            self._curve_columns = [c for c in schema.curves.columns if c.name not in missing.get(schema.curves.name, [])]
        else:
            schema.metadata.create_all(self.engine)
            migrate.add_missing_columns(self.engine)
            self._experiment_columns = list(schema.experiments.columns)
            self._curve_columns = list(schema.curves.columns)

    @property
    def url_shown(self) -> str:
        """The URL without its password, for messages and logs."""
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def backend(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ writes

    def write(self, batch: Batch) -> None:
        """Upsert a batch in one transaction."""
        if self.read_only:
            raise PermissionError(f"results store {self.url_shown} was opened read-only")
        with self.engine.begin() as connection:
            curve_rows.serialise(connection, (r.trial_uid for r in batch.results))   # before any row is touched
            self._upsert(connection, schema.experiments, ["uid"], [
                {"uid": e.uid, "namespace": e.namespace, "name": e.name, "metric": e.metric, "mode": e.mode,
                 "phase": e.phase, "created": e.created or time.time(), "study": e.study}
                for e in batch.experiments],
                keep=("created",))
            self._upsert(connection, schema.trials, ["uid"], [
                {"uid": t.uid, "experiment_uid": t.experiment_uid, "name": t.name, "index": t.index,
                 "params": json.dumps(dict(t.params), default=str), "phase": t.phase, "reason": t.reason,
                 "best": t.best, "iteration": t.iteration, "attempt": t.attempt} for t in batch.trials])
            self._upsert(connection, schema.results, ["trial_uid", "seq"], [
                {"trial_uid": r.trial_uid, "seq": r.seq, "iteration": r.iteration, "attempt": r.attempt,
                 "time": r.time, "checkpoint": r.checkpoint} for r in batch.results])
            self._upsert(connection, schema.metrics, ["trial_uid", "seq", "name"], [
                dict(zip(("kind", "value", "text"), values.encode(value)), trial_uid=r.trial_uid, seq=r.seq, name=name)
                for r in batch.results for name, value in r.metrics.items()])
            curve_rows.update(connection, self._upsert, batch.results)
            self._upsert(connection, schema.failures, ["trial_uid", "attempt"], [
                {"trial_uid": f.trial_uid, "attempt": f.attempt, "reason": f.reason, "message": f.message,
                 "time": f.time} for f in batch.failures])
            self._upsert(connection, schema.usage, ["trial_uid", "attempt"], [
                {"trial_uid": u.trial_uid, "attempt": u.attempt, "started": u.started, "ended": u.ended,
                 "seen": u.seen, "run_seconds": u.run_seconds, "gpu_seconds": u.gpu_seconds,
                 "cpu_seconds": u.cpu_seconds, "queue_seconds": u.queue_seconds} for u in batch.usage])

    def _upsert(self, connection, table, keys: list[str], rows: Sequence[dict[str, Any]],
                keep: Iterable[str] = ()) -> None:
        if not rows:
            return
        # every text made storable first (a trial's metric name or error can hold anything),
        # then several updates of one row in a batch: the last wins (and one statement may
        # not touch a row twice on PostgreSQL's multi-row path)
        texts = [c.name for c in table.columns if isinstance(c.type, String)]   # Text is a String
        rows = [_storable(row, texts) for row in rows]
        unique = list({tuple(row[k] for k in keys): row for row in rows}.values())
        statement = self._insert(table)
        update = {c.name: statement.excluded[c.name] for c in table.columns
                  if c.name not in keys and c.name not in keep}
        statement = statement.on_conflict_do_update(index_elements=keys, set_=update)
        for start in range(0, len(unique), CHUNK_ROWS):
            connection.execute(statement, unique[start:start + CHUNK_ROWS])

    # ------------------------------------------------------------------ retention

    def delete_experiment(self, uid: str) -> int:
        """Remove an Experiment and everything stored under it (its Kubernetes object is
        gone); returns the number of results removed.  Safe to repeat."""
        return self._delete([uid])

    def delete_finished_before(self, cutoff: float, phases: Iterable[str]) -> int:
        """Remove the Experiments in one of ``phases`` first seen before ``cutoff`` (epoch
        seconds), with their trials and results; returns the number of results removed."""
        e = schema.experiments
        with self.engine.connect() as connection:
            uids = list(connection.execute(select(e.c.uid).where(e.c.created < cutoff, e.c.phase.in_(list(phases))))
                        .scalars())
        return self._delete(uids)

    def _delete(self, experiment_uids: Sequence[str]) -> int:
        removed = 0
        e, t, r, m, f = schema.experiments, schema.trials, schema.results, schema.metrics, schema.failures
        for uid in experiment_uids:   # one transaction per Experiment: a big store is not locked for long
            with self.engine.begin() as connection:
                trials = select(t.c.uid).where(t.c.experiment_uid == uid).scalar_subquery()
                for table in (m, r, f, schema.usage, schema.curves):
                    # a trial whose UID was not known yet is stored under "<experiment uid>/<name>"
                    owned = table.c.trial_uid.in_(trials) | table.c.trial_uid.startswith(f"{uid}/", autoescape=True)
                    count = connection.execute(delete(table).where(owned)).rowcount or 0
                    removed += count if table is r else 0
                connection.execute(delete(t).where(t.c.experiment_uid == uid))
                connection.execute(delete(e).where(e.c.uid == uid))
        return removed

    # ------------------------------------------------------------------ reads

    def experiments(self, namespace: str | None = None) -> list[ExperimentRow]:
        query = select(*self._experiment_columns).order_by(schema.experiments.c.created)
        if namespace is not None:
            query = query.where(schema.experiments.c.namespace == namespace)
        with self.engine.connect() as connection:
            return [ExperimentRow(**row._mapping) for row in connection.execute(query)]

    def experiment(self, namespace: str, name: str) -> ExperimentRow | None:
        """The newest Experiment of that name (an Experiment deleted and re-created is a new one)."""
        found = [e for e in self.experiments(namespace) if e.name == name]
        return found[-1] if found else None

    def trials(self, experiment_uid: str) -> list[TrialRow]:
        table = schema.trials
        query = select(table).where(table.c.experiment_uid == experiment_uid).order_by(table.c.index, table.c.name)
        names = [column.name for column in table.columns]
        with self.engine.connect() as connection:   # the driver's tuples: a study view reads 10,000 at once
            rows = [dict(zip(names, row)) for row in _raw_rows(connection, query)]
        for row in rows:
            row["params"] = values.loads(row["params"])
        return [TrialRow(**row) for row in rows]

    def results(self, experiment_uid: str, trial_uid: str | None = None) -> list[ResultRow]:
        """Every stored result of the experiment (or one trial), by trial and seq."""
        uids = [trial_uid] if trial_uid else [t.uid for t in self.trials(experiment_uid)]
        rows: list[ResultRow] = []
        with self.engine.connect() as connection:
            for uid in uids:
                metrics: dict[int, dict[str, Any]] = {}
                m = schema.metrics
                for row in connection.execute(select(m.c.seq, m.c.name, m.c.kind, m.c.value, m.c.text)
                                              .where(m.c.trial_uid == uid)):
                    metrics.setdefault(row.seq, {})[row.name] = values.decode(row.kind, row.value, row.text)
                r = schema.results
                for row in connection.execute(select(r).where(r.c.trial_uid == uid).order_by(r.c.seq)):
                    rows.append(ResultRow(trial_uid=uid, seq=row.seq, iteration=row.iteration,
                                          metrics=metrics.get(row.seq, {}), time=row.time,
                                          attempt=row.attempt, checkpoint=row.checkpoint))
        return rows

    def usage(self, experiment_uid: str) -> list[UsageRow]:
        """What every attempt of the experiment's trials used, by trial and attempt."""
        u, t = schema.usage, schema.trials
        if self.read_only and not inspect(self.engine).has_table(u.name):
            return []    # a database from before the table, opened without creating it
        query = (select(u).join(t, t.c.uid == u.c.trial_uid).where(t.c.experiment_uid == experiment_uid)
                 .order_by(t.c.index, u.c.attempt))
        with self.engine.connect() as connection:
            return [UsageRow(**row._mapping) for row in connection.execute(query)]

    def iteration_times(self, experiment_uid: str) -> list[tuple[str, int | None, int, float]]:
        """(trial uid, attempt, iteration, time) of every stored result: what an iteration
        took, for ``kubetune plan`` (core/plan.measured_seconds_per_iteration)."""
        r, t = schema.results, schema.trials
        query = (select(r.c.trial_uid, r.c.attempt, r.c.iteration, r.c.time)
                 .join(t, t.c.uid == r.c.trial_uid).where(t.c.experiment_uid == experiment_uid))
        with self.engine.connect() as connection:
            return [(row.trial_uid, row.attempt, int(row.iteration), float(row.time))
                    for row in connection.execute(query)]

    def last_seqs(self, trial_uids: Sequence[str]) -> dict[str, int]:
        """The highest stored result seq of each trial that has any."""
        r = schema.results
        query = select(r.c.trial_uid, func.max(r.c.seq)).where(r.c.trial_uid.in_(list(trial_uids))) \
            .group_by(r.c.trial_uid)
        with self.engine.connect() as connection:
            return {uid: int(seq) for uid, seq in connection.execute(query)}

    # ------------------------------------------------------------------ reads for a study view (dashboard)
    # Each takes ``trial_uids`` (only those trials, read in chunks) or None (the whole
    # Experiment, one statement): a view re-reads only the trials that changed.

    def _chunks(self, experiment_uid: str, column, trial_uids: Sequence[str] | None):
        if trial_uids is None:
            t = schema.trials
            yield column.in_(select(t.c.uid).where(t.c.experiment_uid == experiment_uid))
            return
        for start in range(0, len(trial_uids), CHUNK_ROWS):
            yield column.in_(list(trial_uids[start:start + CHUNK_ROWS]))

    def result_stats(self, experiment_uid: str,
                     trial_uids: Sequence[str] | None = None) -> dict[str, tuple[int, int, int]]:
        """Trial UID -> (results stored, lowest seq, highest seq), from the primary key's
        index alone: it changes whenever a result is added, so a reader can cache the rest."""
        r = schema.results
        found: dict[str, tuple[int, int, int]] = {}
        with self.engine.connect() as connection:
            for where in self._chunks(experiment_uid, r.c.trial_uid, trial_uids):
                query = (select(r.c.trial_uid, func.count(), func.min(r.c.seq), func.max(r.c.seq))
                         .where(where).group_by(r.c.trial_uid))
                found.update((uid, (int(n), int(low), int(high))) for uid, n, low, high in connection.execute(query))
        return found

    def curves(self, experiment_uid: str, metric: str,
               trial_uids: Sequence[str] | None = None) -> list[tuple[str, int, float, float]]:
        """(trial UID, iteration, time, value) of every result reporting ``metric`` as a
        number (NaN and ±Infinity included), in (trial, seq) order."""
        m, r = schema.metrics, schema.results
        rows: list[tuple[str, int, float, float]] = []
        with self.engine.connect() as connection:
            for where in self._chunks(experiment_uid, m.c.trial_uid, trial_uids):
                query = (select(m.c.trial_uid, r.c.iteration, r.c.time, m.c.value)
                         .join(r, (r.c.trial_uid == m.c.trial_uid) & (r.c.seq == m.c.seq))
                         .where(where, m.c.name == metric, m.c.kind.in_(("f", "i")))
                         .order_by(m.c.trial_uid, m.c.seq))
                rows.extend(_raw_rows(connection, query))
        # SQLite keeps a NaN as NULL (schema.Double)
        return [row if row[3] is not None else (*row[:3], math.nan) for row in rows]

    def compact_curves(self, experiment_uid: str, metric: str, trial_uids: Sequence[str] | None = None,
                       probe: bool = False) -> dict[str, curve_rows.CompactCurve]:
        """Trial UID -> its compact row (results/curves.py) for ``metric``, its points left
        packed (``CompactCurve.packed``), rows given up left out.  A caller uses a row only
        when its ``results`` and ``seq`` match ``result_stats`` (and its last values when
        its ``metrics`` hold those it needs);
        any other trial it reads through ``curves`` and ``last_values``.  ``probe``: also
        look whether a result with a higher seq than a row's is stored (``behind``)."""
        c = schema.curves
        if self.read_only and not inspect(self.engine).has_table(c.name):
            return {}    # a database from before the table, opened without creating it
        found: dict[str, curve_rows.CompactCurve] = {}
        with self.engine.connect() as connection:
            for where in self._chunks(experiment_uid, c.c.trial_uid, trial_uids):
                columns = list(self._curve_columns)
                if probe:   # in the same statement: the row and whether it is behind are of one state
                    r = schema.results
                    columns.append(exists().where(r.c.trial_uid == c.c.trial_uid, r.c.seq > c.c.seq))
                query = select(*columns).where(where, c.c.metric == metric, c.c.overflow == 0)
                for row in _raw_rows(connection, query):
                    curve = found[row[0]] = curve_rows.from_row(row[:len(self._curve_columns)], unpacked=False)
                    curve.behind = probe and bool(row[-1])
        return found

    def last_values(self, experiment_uid: str, metrics: Sequence[str],
                    trial_uids: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
        """Trial UID -> the numbers among ``metrics`` in its last result (highest seq):
        what the operator tells Optuna a finished trial's values are."""
        m, r = schema.metrics, schema.results
        found: dict[str, dict[str, float]] = {}
        with self.engine.connect() as connection:
            for where in self._chunks(experiment_uid, r.c.trial_uid, trial_uids):
                last = select(r.c.trial_uid, func.max(r.c.seq).label("seq")).where(where) \
                    .group_by(r.c.trial_uid).subquery()
                query = (select(m.c.trial_uid, m.c.name, m.c.value)
                         .join(last, (last.c.trial_uid == m.c.trial_uid) & (last.c.seq == m.c.seq))
                         .where(m.c.name.in_(list(metrics)), m.c.kind.in_(("f", "i"))))
                for uid, name, value in connection.execute(query):
                    found.setdefault(uid, {})[name] = math.nan if value is None else value
        return found

    def failures(self, experiment_uid: str) -> list[FailureRow]:
        f, t = schema.failures, schema.trials
        query = (select(f).join(t, t.c.uid == f.c.trial_uid).where(t.c.experiment_uid == experiment_uid)
                 .order_by(t.c.index, f.c.attempt))
        with self.engine.connect() as connection:
            return [FailureRow(**row._mapping) for row in connection.execute(query)]
