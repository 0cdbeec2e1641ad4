"""One compact row per trial holding its objective's curve (``schema.curves``), kept by
``ResultsStore.write`` in the same transaction as the results, so that a study view
reads ~one row per trial instead of every metric row of every result (10,000 trials
x 100 results: 10,000 rows, not a million joined to their results).

A row is the curve as a study view shows it: for the Experiment's first objective,
the first value reported at each iteration (Optuna keeps the first), in seq order,
and the times of the first and last result reporting it; and the numbers its last
result reported for each of the study's metrics (objectives and constraints: what a
view tells Optuna the trial's values are).  It also records how many
results of the trial it was made from and the highest seq, so a reader uses it only
when it matches the results stored (``ResultsStore.result_stats``) and otherwise
reads the metric rows as before: databases written before this table, trials whose
row or Experiment was not stored yet, and rows given up (below) all still read right.

Bounded whatever a trial reports: at most ``MAX_POINTS`` iterations (16 bytes each);
a trial reporting more iterations keeps a row marked ``overflow`` with no points, and
readers read its metric rows.  Appending costs reading and rewriting one row of at
most that size per trial per batch; a result re-delivered with a seq already merged
(the run that replaced a lost one reuses seqs) rebuilds the row from the tables."""
from __future__ import annotations

import json
import math
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import orjson
from sqlalchemy import func, select, text

from kubetune.results import schema, values
from kubetune.results.rows import ResultRow

MAX_POINTS = 1000       # iterations kept in one row; beyond: ``overflow`` (readers use the metric rows)
MAX_METRICS = 32        # study metrics whose last values a row keeps (a study with more: readers read them)
CHUNK = 5000            # trial UIDs per IN list


@dataclass
class CompactCurve:
    """A trial's row as plain values: ``steps`` and ``values`` in the order first seen."""
    metric: str
    results: int = 0                 # results of the trial merged (with the metric or not)
    seq: int = -1                    # the highest seq merged
    started: float | None = None     # time of the first result reporting the metric as a number
    ended: float | None = None       # ... and of the last
    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    overflow: bool = False
    metrics: tuple[str, ...] = ()    # the study's metrics (``metric`` first) whose last values ``last`` holds
    last: dict[str, float] = field(default_factory=dict)   # ... those the last result reported as numbers
    packed: tuple[bytes, bytes] | None = None   # read with ``unpacked=False``: (steps, values) as stored
    points_json: bytes | None = None    # the points as JSON (``encode_points``), when the row's is current
    encoded: int = 0                    # ... how many of ``steps`` it holds (the writer appends the rest)
    behind: bool = False                # read with ``probe``: a result past ``seq`` is stored (not merged)

    def add(self, seq: int, iteration: int, at: float, numbers: dict[str, float], seen: set[int]) -> None:
        """Merge one result, in seq order (``numbers``: what it reported as numbers among ``metrics``)."""
        self.results += 1
        self.seq = max(self.seq, seq)
        self.last = numbers
        value = numbers.get(self.metric)
        if value is None or self.overflow:
            return
        if self.started is None:
            self.started = at
        self.ended = at
        if iteration in seen:
            return
        if len(self.steps) >= MAX_POINTS:
            self.overflow, self.steps, self.values = True, [], []
            return
        seen.add(iteration)
        self.steps.append(iteration)
        self.values.append(value)

    def intermediate(self) -> dict[int, float]:
        if self.packed is not None:
            return dict(zip(unpack("q", self.packed[0]), unpack("d", self.packed[1])))
        return dict(zip(self.steps, self.values))


def _pack(kind: str, items: Sequence) -> bytes:
    packed = array(kind, items)
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def unpack(kind: str, data: bytes | None) -> list:
    packed = array(kind, bytes(data or b""))
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tolist()


def to_row(trial_uid: str, curve: CompactCurve) -> dict:
    steps, step_values = _pack("q", curve.steps), _pack("d", curve.values)
    points = encode_points(curve)
    return {"trial_uid": trial_uid, "metric": curve.metric, "results": curve.results, "seq": curve.seq,
            "started": curve.started, "ended": curve.ended, "overflow": int(curve.overflow),
            "steps": steps, "step_values": step_values,
            "last": _last_json(curve),
            "points_json": points, "points_crc": None if points is None else points_crc(steps, step_values, points)}


def _last_json(curve: CompactCurve) -> str:
    kept = {"metrics": curve.metrics, "values": curve.last}
    if all(map(math.isfinite, curve.last.values())):   # orjson: the same JSON, ~10x faster
        return orjson.dumps(kept).decode()
    return json.dumps(kept)   # NaN, Infinity: as Python's JSON writes them (orjson would write null)


def from_row(row, unpacked: bool = True) -> CompactCurve:
    """A stored row (the columns of ``schema.curves`` in order; the later ones absent or
    None in a row an older kubetune wrote) as a CompactCurve; ``unpacked=False``: its
    points left packed in ``packed`` (a reader that only passes them on spares a million
    list items).  ``points_json`` is kept only when it is of the points stored (an older
    kubetune writing to this database updates the points, not it)."""
    _, metric, results, seq, started, ended, overflow, steps, numbers, *later = row
    last, points, crc = (list(later) + [None, None, None])[:3]
    kept = values.loads(last) if last else {"metrics": [], "values": {}}
    curve = CompactCurve(metric, int(results), int(seq), started, ended, overflow=bool(overflow),
                         metrics=tuple(kept["metrics"]), last=kept["values"])
    steps, numbers = bytes(steps or b""), bytes(numbers or b"")
    if points is not None and crc is not None and int(crc) == points_crc(steps, numbers, bytes(points)):
        curve.points_json, curve.encoded = bytes(points), len(steps) // 8
    if unpacked:
        curve.steps, curve.values = unpack("q", steps), unpack("d", numbers)
    else:
        curve.packed = (steps, numbers)
    return curve


def points_crc(steps: bytes, step_values: bytes, points: bytes) -> int:
    """Of the points and of their JSON: the JSON is spliced into every study page unparsed
    (orjson.Fragment), so JSON that is not the one made from these points (changed by hand,
    a bad restore) must not be used; about 20 ms for a 10,000-trial study's 50 MB."""
    return zlib.crc32(points, zlib.crc32(step_values, zlib.crc32(steps)))


def encode_points(curve: CompactCurve) -> bytes | None:
    """``[{"step": s, "value": v}, ...]``: the points by step as JSON, what a study view
    sends (optuna-dashboard's form; a cold opening splices it in as it is, instead of
    formatting a million floats).  None, and readers format the points themselves, when
    a value is not finite (that form writes those as strings) or steps came out of
    order.  Appends to the text the row had (``encoded`` points) rather than making it
    again: a long trial's batch costs its new points."""
    if curve.overflow:
        return None
    steps, numbers = curve.steps, curve.values
    done = curve.encoded if curve.points_json is not None and curve.encoded <= len(steps) else 0
    new_steps, new_values = steps[done:], numbers[done:]   # the text holds the others: finite, by step
    if not all(map(math.isfinite, new_values)) or new_steps != sorted(new_steps) \
            or (done and new_steps and new_steps[0] <= steps[done - 1]):
        return None
    tail = orjson.dumps([{"step": s, "value": v} for s, v in zip(new_steps, new_values)])
    if not done:
        return tail
    if tail == b"[]":
        return curve.points_json
    return curve.points_json[:-1] + b"," + tail[1:]


def numbers_of(reported, metrics: Sequence[str]) -> dict[str, float]:
    found = {}
    for name in metrics:
        value = number(reported.get(name))
        if value is not None:
            found[name] = value
    return found


def number(value) -> float | None:
    """The value as the curve query reads it (kinds f and i), else None."""
    kind, as_float, _ = values.encode(value)
    if kind not in ("f", "i"):
        return None
    return math.nan if as_float is None else as_float


def _chunks(uids: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(uids), CHUNK):
        yield list(uids[start:start + CHUNK])


def study_metrics(metric: str, study: str) -> tuple[str, ...]:
    """The objectives (the first leads) and constraint metrics of an Experiment row (its
    study JSON, else its one metric), as kubetune.dashboard.study.shape_of reads them."""
    try:
        data = json.loads(study) if study else {}
        objectives = [str(o["metric"]) for o in data.get("objectives") or [] if isinstance(o, dict) and o.get("metric")]
        constraints = [str(c["metric"]) for c in data.get("constraints") or [] if isinstance(c, dict) and c.get("metric")]
    except (ValueError, AttributeError, TypeError):
        objectives, constraints = [], []
    return tuple(dict.fromkeys((objectives or [metric or "objective"]) + constraints))[:MAX_METRICS]


# A key space of our own for PostgreSQL's advisory locks (``serialise``): "ktcv".
LOCK_CLASS = 0x6B746376
# Trial UIDs share this many locks: a batch of up to 20,000 results of as many trials takes
# at most 256 of PostgreSQL's shared lock slots (~6,400 by default, for every session),
# never "out of shared memory"; two trials of one bucket only take turns.
LOCK_KEYS = 256
_SERIALISE = text("SELECT pg_advisory_xact_lock(CAST(:space AS integer), key) FROM (SELECT DISTINCT "
                  "hashtext(uid) & CAST(:keys - 1 AS integer) AS key FROM unnest(CAST(:uids AS text[])) AS uid) "
                  "AS keys ORDER BY key")


def serialise(connection, trial_uids: Iterable[str]) -> None:
    """Make the writers of these trials' rows take turns, until the transaction ends;
    ``ResultsStore.write`` calls it first thing in its transaction.

    ``update`` reads a trial's row and writes it back with the batch's points added.
    SQLite already lets one writer at a time past the batch's first insert, but on
    PostgreSQL (READ COMMITTED) two writers of the same trial at once (the chart's two
    replicas during a leader handover, the old leader's writer still flushing) would
    both read the row as it was and the second's write would drop the first's points,
    under a ``seq`` readers then take as covering them.  Here each waits for the other's
    commit, then reads the row it wrote: one lock per bucket of trial UIDs (LOCK_KEYS; two
    trials of a bucket only take turns), taken in one order by every writer, so two
    batches of several trials do not wait for each other in a circle."""
    uids = sorted(set(trial_uids))
    if uids and connection.dialect.name == "postgresql":
        connection.execute(_SERIALISE, {"space": LOCK_CLASS, "keys": LOCK_KEYS, "uids": uids})


def update(connection, upsert, results: Sequence[ResultRow]) -> None:
    """Bring the rows of the trials in ``results`` up to date; called by ``ResultsStore.write``
    after it stored them, in its transaction.  ``upsert(connection, table, keys, rows)``."""
    if not results:
        return
    by_trial: dict[str, list[ResultRow]] = {}
    for row in results:
        by_trial.setdefault(row.trial_uid, []).append(row)
    uids = list(by_trial)
    t, e, c, r = schema.trials, schema.experiments, schema.curves, schema.results
    measured: dict[str, tuple[str, ...]] = {}     # trial UID -> its study's metrics, the objective first
    kept: dict[str, CompactCurve] = {}
    stats: dict[str, tuple[int, int]] = {}
    parsed: dict[tuple[str, str], tuple[str, ...]] = {}
    for chunk in _chunks(uids):
        query = select(t.c.uid, e.c.metric, e.c.study).join(e, e.c.uid == t.c.experiment_uid).where(t.c.uid.in_(chunk))
        for uid, metric, study in connection.execute(query):
            if (metric, study) not in parsed:   # an Experiment's study JSON parsed once, not per trial
                parsed[metric, study] = study_metrics(metric, study)
            measured[uid] = parsed[metric, study]
        kept.update((row[0], from_row(row)) for row in connection.execute(select(c).where(c.c.trial_uid.in_(chunk))))
        # Only a row made afresh is checked against the stored results (were some stored
        # before it?): counting a long trial's results at every batch made each write cost
        # grow with the trial (45 ms a batch at 200,000 results).  A kept row is written in
        # the results' transaction, so it counts them itself; readers check it anyway.
        fresh = [uid for uid in chunk if uid not in kept or kept[uid].metrics != measured.get(uid)]
        if fresh:
            query = select(r.c.trial_uid, func.count(), func.max(r.c.seq)).where(r.c.trial_uid.in_(fresh)) \
                .group_by(r.c.trial_uid)
            stats.update((uid, (int(n), int(high))) for uid, n, high in connection.execute(query))
    rows, rebuild = [], []
    for uid, rows_of_trial in by_trial.items():
        metrics = measured.get(uid)
        if metrics is None:     # its trial row is not stored yet: readers read its metric rows
            continue
        metric = metrics[0]
        ordered = list({row.seq: row for row in rows_of_trial}.values())   # the last delivery of a seq wins
        ordered.sort(key=lambda row: row.seq)
        curve = kept.get(uid)
        if curve is not None and curve.overflow and curve.metrics == metrics:
            continue            # given up: nothing to keep up to date
        fresh = curve is None or curve.metrics != metrics
        if fresh:
            curve = CompactCurve(metric, metrics=metrics)   # from this batch alone, if it holds all the trial's results
        elif ordered[0].seq <= curve.seq:
            rebuild.append(uid)             # a seq delivered again: what it replaced is in the row
            continue
        seen = set(curve.steps)
        for row in ordered:
            curve.add(row.seq, row.iteration, row.time, numbers_of(row.metrics, metrics), seen)
        if fresh and (curve.results, curve.seq) != stats.get(uid):
            rebuild.append(uid)             # results stored before the row existed (an older kubetune)
            continue
        rows.append(to_row(uid, curve))
    for uid in rebuild:
        rows.append(to_row(uid, _from_tables(connection, uid, measured[uid])))
    upsert(connection, c, ["trial_uid"], rows)


def _from_tables(connection, trial_uid: str, metrics: tuple[str, ...]) -> CompactCurve:
    """A trial's row made from every stored result (the rows of this transaction included)."""
    r, m = schema.results, schema.metrics
    numbers: dict[int, dict[str, float]] = {}
    query = select(m.c.seq, m.c.name, m.c.value).where(m.c.trial_uid == trial_uid, m.c.name.in_(list(metrics)),
                                                       m.c.kind.in_(("f", "i")))
    for seq, name, value in connection.execute(query):
        numbers.setdefault(int(seq), {})[name] = math.nan if value is None else value   # SQLite: NaN as NULL
    curve, seen = CompactCurve(metrics[0], metrics=metrics), set()
    query = select(r.c.seq, r.c.iteration, r.c.time).where(r.c.trial_uid == trial_uid).order_by(r.c.seq)
    for seq, iteration, at in connection.execute(query):
        curve.add(int(seq), int(iteration), float(at), numbers.get(int(seq), {}), seen)
    return curve
