"""What the results writer needs to keep one bad row from stopping everyone's results:
which errors mean "the database is away" (retry everything later) rather than "the
database refuses these rows" (find the rows), how to halve a batch, what a row costs
in memory, and which Experiment a row belongs to.  No I/O here."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from sqlalchemy import exc

from kubetune.results.rows import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow, UsageRow

# the server or the connection, not the rows: nothing to bisect, everything is retried
_OUTAGES = (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError, exc.TimeoutError,
            ConnectionError, TimeoutError)

ROW_OVERHEAD = 200      # bytes of a row object with its few scalars (measured with tracemalloc: ~150-250)
METRIC_OVERHEAD = 120   # per metric: its dict slot, its name and value objects, its metric-row dict


@dataclass
class Rejection:
    """Rows of one Experiment the store refused and that were set aside."""
    rows: int
    kinds: tuple[str, ...]   # exception class names
    example: str             # the first such row, named without its values


def set_aside(rejected: dict[str, Rejection], experiment: str, row: Any, kind: str) -> None:
    """Count ``row`` (refused with an exception of class ``kind``) against ``experiment``."""
    known = rejected.get(experiment)
    if known is None:
        rejected[experiment] = Rejection(1, (kind,), describe(row))
        return
    known.rows += 1
    if kind not in known.kinds:
        known.kinds += (kind,)


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says the store cannot be reached or is unwell as a whole (SQLite's
    "database is locked" and "disk is full" are OperationalErrors too: waiting helps)."""
    return isinstance(error, _OUTAGES) or bool(getattr(error, "connection_invalidated", False))


def halves(batch: Batch) -> tuple[Batch, Batch]:
    """``batch`` split into two non-empty parts (``len(batch) >= 2``).  Rows of different
    tables are independent (no foreign keys), so any split is writable on its own."""
    rows = [*batch.experiments, *batch.trials, *batch.results, *batch.failures, *batch.usage]
    middle = len(rows) // 2
    return batch_of(rows[:middle]), batch_of(rows[middle:])


def batch_of(rows) -> Batch:
    batch = Batch()
    for row in rows:
        if isinstance(row, ExperimentRow):
            batch.experiments.append(row)
        elif isinstance(row, TrialRow):
            batch.trials.append(row)
        elif isinstance(row, ResultRow):
            batch.results.append(row)
        elif isinstance(row, UsageRow):
            batch.usage.append(row)
        else:
            batch.failures.append(row)
    return batch


def only_row(batch: Batch) -> ExperimentRow | TrialRow | ResultRow | FailureRow:
    return next(iter([*batch.experiments, *batch.trials, *batch.results, *batch.failures, *batch.usage]))


def _value_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (int, float, bool)) or value is None:
        return 8
    return len(json.dumps(value, default=str))   # a list or dict metric: rare, and bounded at ingest


def row_bytes(row: ExperimentRow | TrialRow | ResultRow | FailureRow) -> int:
    """An estimate of the memory a pending row holds (and the rows it becomes when written)."""
    if isinstance(row, ResultRow):   # the hot case (every result, a few times): no call per metric
        size = ROW_OVERHEAD + len(row.checkpoint or "") + METRIC_OVERHEAD * len(row.metrics)
        for name, value in row.metrics.items():
            kind = type(value)
            size += len(name) + (8 if kind is float or kind is int else len(value) if kind is str
                                 else _value_bytes(value))
        return size
    if isinstance(row, FailureRow):
        return ROW_OVERHEAD + len(row.message) + len(row.reason)
    if isinstance(row, UsageRow):
        return ROW_OVERHEAD + 64
    if isinstance(row, TrialRow):
        return ROW_OVERHEAD + len(row.name) + len(row.reason) + sum(
            METRIC_OVERHEAD + len(str(k)) + _value_bytes(v) for k, v in row.params.items())
    return ROW_OVERHEAD + len(row.name) + len(row.namespace) + len(row.metric)


def owner(row: ExperimentRow | TrialRow | ResultRow | FailureRow, trial_owners: Mapping[str, str]) -> str:
    """The UID of the Experiment a row belongs to ("" when unknown)."""
    if isinstance(row, ExperimentRow):
        return row.uid
    if isinstance(row, TrialRow):
        return row.experiment_uid
    known = trial_owners.get(row.trial_uid)
    if known is not None:
        return known
    # a trial whose UID was not known yet: ResultsRecorder names it "<experiment uid>/<name>"
    return row.trial_uid.split("/", 1)[0] if "/" in row.trial_uid else ""


def describe(row: ExperimentRow | TrialRow | ResultRow | FailureRow) -> str:
    """The row, named without its values (for the Experiment's own condition)."""
    if isinstance(row, ResultRow):
        return f"result seq {row.seq}"
    if isinstance(row, FailureRow):
        return f"failure record of attempt {row.attempt}"
    if isinstance(row, UsageRow):
        return f"usage record of attempt {row.attempt}"
    if isinstance(row, TrialRow):
        return f"trial record {row.name[:80]}"
    return "experiment record"
