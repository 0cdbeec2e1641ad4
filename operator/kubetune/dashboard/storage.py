"""``ResultsStoreStorage``: the results store as a read-only Optuna storage, which is
what optuna-dashboard reads (``optuna_dashboard.wsgi(storage)``).

Each Experiment is a study; nothing is copied into a second database.  What the
dashboard calls, and what it costs here:

- ``get_all_studies`` (on every page and every poll): the Experiment rows, re-read
  at most once a second;
- ``get_all_trials(study_id, deepcopy=False)`` (the dashboard's own cache asks every
  2-10 s): a per-study cache of frozen trials.  Revalidating it reads the trial rows
  and one grouped count of results per trial (index-only); only trials whose row or
  results changed are read again, so a running Experiment costs what it added;
- ``get_best_trial``, ``get_study_directions`` ... : from the same caches.

Study IDs are derived from the Experiment's UID (``study_id_of``) so a page's address
outlives a restart of the dashboard and the operator can name it (status.dashboard)."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Container

from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from kubetune.core.optuna_compat import FrozenStudy
from kubetune.dashboard.gc_pause import collection_paused
from kubetune.dashboard.packed_trial import Points
from kubetune.dashboard.study import METRIC_NAMES_KEY, Curve, StudyShape, distributions_for, frozen_trial, shape_of
from kubetune.results.curves import CompactCurve
from kubetune.results.rows import ExperimentRow, TrialRow
from kubetune.results.store import ResultsStore

TRIAL_BITS = 22                 # trial ID = study ID << 22 | number: both fit a JavaScript number
STUDY_BITS = 30
STUDIES_TTL_SECONDS = 1.0       # the Experiment list is re-read at most this often
TRIALS_TTL_SECONDS = 1.0        # a study's trials are revalidated at most this often
REFETCH_ALL_SHARE = 0.5         # more trials changed than this: read the whole Experiment at once
SETTLE_SECONDS = 30.0           # a finished trial unchanged this long is settled (``_settle``)
FINISHED_PHASES = ("Succeeded", "Failed", "Stopped")


class ReadOnlyStorageError(PermissionError):
    pass


def study_id_of(uid: str) -> int:
    """The study ID of an Experiment UID (before collisions, ``_Studies`` resolves them)."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") % (1 << STUDY_BITS) or 1


def _read_only(*_args: Any, **_kwargs: Any) -> Any:
    raise ReadOnlyStorageError("kubetune dashboard is read-only: the results store is written by the operator "
                               "and `kubetune run`; change an Experiment with kubectl instead")


@dataclass
class _Study:
    id: int
    row: ExperimentRow
    name: str
    shape: StudyShape


@dataclass
class _TrialCache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    checked: float = 0.0
    rows: dict[str, TrialRow] = field(default_factory=dict)             # uid -> row as last read
    stats: dict[str, tuple] = field(default_factory=dict)               # uid -> (results, highest seq)
    quiet_since: dict[str, float] = field(default_factory=dict)         # finished, results unchanged since
    settled: set[str] = field(default_factory=set)                      # finished and quiet: not counted
    curves: dict[str, Curve] = field(default_factory=dict)
    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    frozen: dict[str, FrozenTrial] = field(default_factory=dict)
    trials: list[FrozenTrial] = field(default_factory=list)             # by number


class ResultsStoreStorage(BaseStorage):
    """``store``: the store, or a callable opening it, retried on each look while it
    raises FileNotFoundError (the chart's dashboard starts before the operator's
    first result creates the SQLite file: until then there is no study)."""

    def __init__(self, store: ResultsStore | Callable[[], ResultsStore], *, namespace: str | None = None,
                 experiment: str | None = None) -> None:
        self._store = store if isinstance(store, ResultsStore) else None
        self._open = store if not isinstance(store, ResultsStore) else None
        self.namespace = namespace
        self.experiment = experiment
        self._lock = threading.Lock()
        self._studies: dict[int, _Study] = {}
        self._studies_read = 0.0
        self._caches: dict[int, _TrialCache] = {}

    @property
    def store(self) -> ResultsStore | None:
        if self._store is None:
            try:
                self._store = self._open()
            except FileNotFoundError:
                return None
        return self._store

    # ------------------------------------------------------------------ studies

    def studies(self) -> dict[int, _Study]:
        with self._lock:
            if time.monotonic() - self._studies_read < STUDIES_TTL_SECONDS and self._studies:
                return self._studies
            store = self.store
            rows = [] if store is None else [r for r in store.experiments(self.namespace)
                                             if self.experiment is None or r.name == self.experiment]
            studies: dict[int, _Study] = {}
            newest = {(r.namespace, r.name): r.uid for r in rows}   # rows come oldest first
            for row in rows:
                study_id = study_id_of(row.uid)
                while study_id in studies:          # a hash collision: the later Experiment moves on
                    study_id = study_id % ((1 << STUDY_BITS) - 1) + 1
                name = f"{row.namespace}/{row.name}"
                if newest[(row.namespace, row.name)] != row.uid:   # deleted and re-created: an older one
                    name += f" (uid {row.uid[:8]})"
                studies[study_id] = _Study(study_id, row, name, shape_of(row))
            self._studies, self._studies_read = studies, time.monotonic()
            return studies

    def _study(self, study_id: int) -> _Study:
        study = self.studies().get(study_id)
        if study is None:
            raise KeyError(f"no study with ID {study_id}")
        return study

    def study_id_for(self, namespace: str, name: str) -> int | None:
        """The study of the newest Experiment of that name."""
        found = [s for s in self.studies().values() if (s.row.namespace, s.row.name) == (namespace, name)]
        return max(found, key=lambda s: s.row.created).id if found else None

    def get_all_studies(self) -> list[FrozenStudy]:
        return [FrozenStudy(study_name=s.name, direction=None, directions=s.shape.directions,
                            user_attrs=self.get_study_user_attrs(s.id), system_attrs=self.get_study_system_attrs(s.id),
                            study_id=s.id) for s in sorted(self.studies().values(), key=lambda s: s.row.created)]

    def get_study_id_from_name(self, study_name: str) -> int:
        for study in self.studies().values():
            if study.name == study_name:
                return study.id
        raise KeyError(f"no study named {study_name!r}")

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._study(study_id).name

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return self._study(study_id).shape.directions

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        row = self._study(study_id).row
        return {"namespace": row.namespace, "experiment": row.name, "uid": row.uid, "phase": row.phase}

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        shape = self._study(study_id).shape
        return {METRIC_NAMES_KEY: [metric for metric, _ in shape.objectives]}

    # ------------------------------------------------------------------ trials

    def get_all_trials(self, study_id: int, deepcopy: bool = True,
                       states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        trials = self._trials(study_id)
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else list(trials)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        study_id, number = trial_id >> TRIAL_BITS, trial_id & ((1 << TRIAL_BITS) - 1)
        trials = self._trials(study_id)
        if number >= len(trials):
            raise KeyError(f"no trial with ID {trial_id}")
        return copy.deepcopy(trials[number])

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        if not 0 <= trial_number < len(self._trials(study_id)):
            raise KeyError(f"study {study_id} has no trial number {trial_number}")
        return (study_id << TRIAL_BITS) | trial_number

    def _trials(self, study_id: int) -> list[FrozenTrial]:
        study = self._study(study_id)
        with self._lock:
            cache = self._caches.setdefault(study_id, _TrialCache())
        with cache.lock:
            if time.monotonic() - cache.checked >= TRIALS_TTL_SECONDS:
                with collection_paused() if not cache.rows else contextlib.nullcontext():   # a first read only
                    self._refresh(study, cache)
                cache.checked = time.monotonic()
            return cache.trials

    def _refresh(self, study: _Study, cache: _TrialCache) -> None:
        """Read again only what changed since the last look: trial rows, and the result
        counts of the trials not settled (see ``_settle``)."""
        uid, now = study.row.uid, time.monotonic()
        rows = self.store.trials(uid)
        compact = None
        if not cache.rows and rows:   # a first read: see ``_first_counts``
            compact, stats = self._first_counts(uid, study.shape, rows)
            watched = [r.uid for r in rows]
        else:
            watched = [r.uid for r in rows if r.uid not in cache.settled or cache.rows.get(r.uid) != r]
            stats = _counts(self.store.result_stats(uid, self._which(watched, rows))) if watched else {}
        looked = set(watched)
        changed = [r.uid for r in rows if cache.rows.get(r.uid) != r
                   or r.uid in looked and stats.get(r.uid) != cache.stats.get(r.uid)]
        if changed:
            which = self._which(changed, rows)
            curves, unread = self._curves(uid, study.shape, changed, rows, stats, compact)
            last = self.store.last_values(uid, study.shape.metrics, self._which(unread, rows)) if unread else {}
            for trial_uid in changed:
                curve = curves.get(trial_uid, Curve())
                if trial_uid in unread:
                    curve.last = last.get(trial_uid, {})
                cache.curves[trial_uid] = curve
        # the counts are kept only once the results are read: after a failed read, the next
        # look finds the same trials changed and reads them again
        self._settle(cache, rows, watched, stats, set(changed), now)
        if not changed and len(rows) == len(cache.trials):
            return
        distributions = distributions_for(study.shape.distributions, [r.params for r in rows])
        rebuild = set(changed) if distributions == cache.distributions else {r.uid for r in rows}
        frozen: dict[str, FrozenTrial] = {}
        for number, row in enumerate(rows):
            kept = cache.frozen.get(row.uid)
            if row.uid in rebuild or kept is None or kept.number != number:
                kept = frozen_trial(number, (study.id << TRIAL_BITS) | number, row, study.shape,
                                    cache.curves.get(row.uid, Curve()), distributions)
            frozen[row.uid] = kept
        cache.rows, cache.distributions = {r.uid: r for r in rows}, distributions
        cache.frozen, cache.trials = frozen, list(frozen.values())

    def _first_counts(self, experiment_uid: str, shape: StudyShape,
                      rows: list[TrialRow]) -> tuple[dict[str, CompactCurve], dict[str, tuple]]:
        """The compact rows of every trial and every trial's (results, highest seq), on a
        first read without counting a million results (~0.25 s of a cold opening's CPU): a
        row no stored result is past (one index probe per trial, in the statement reading
        the rows) was made from all of them, by the writer in their transaction, so it
        counts them itself; only trials without such a row (a database an older kubetune
        wrote, a row given up or behind) are counted.  Later looks count as before."""
        compact = self.store.compact_curves(experiment_uid, shape.objectives[0][0], probe=True)
        stats = {uid: (row.results, row.seq) for uid, row in compact.items() if not row.behind}
        uncounted = [r.uid for r in rows if r.uid not in stats]
        if uncounted:
            stats.update(_counts(self.store.result_stats(experiment_uid, self._which(uncounted, rows))))
        return compact, stats

    def _curves(self, experiment_uid: str, shape: StudyShape, changed: list[str], rows: list[TrialRow],
                stats: dict[str, tuple], compact: dict[str, CompactCurve] | None = None,
                ) -> tuple[dict[str, Curve], list[str]]:
        """The curves of ``changed`` trials, and those whose last values are still to read.
        From their compact rows (results/curves.py; ``compact``: read already) when a row
        was made from the results ``stats`` counted, else from the metric rows (a database
        written before the rows, a row given up, a write since the count)."""
        metric, wanted = shape.objectives[0][0], set(shape.metrics)
        if compact is None:
            compact = self.store.compact_curves(experiment_uid, metric, self._which(changed, rows))
        curves: dict[str, Curve] = {}
        unread, no_last = [], []
        for trial_uid in changed:
            counted, row = stats.get(trial_uid), compact.get(trial_uid)
            if counted is None:
                continue    # no result stored (stats are read for every changed trial)
            if row is None or (row.results, row.seq) != counted:
                unread.append(trial_uid)
                continue
            curves[trial_uid] = Curve(started=row.started, ended=row.ended, points=Points(*row.packed, row.points_json))
            if wanted <= set(row.metrics):
                curves[trial_uid].last = {name: row.last[name] for name in shape.metrics if name in row.last}
            else:
                no_last.append(trial_uid)
        if unread:
            curves.update(_curves(self.store.curves(experiment_uid, metric, self._which(unread, rows)), set(unread)))
        return curves, unread + no_last

    @staticmethod
    def _which(uids: list[str], rows: list[TrialRow]) -> list[str] | None:
        """Read these trials by UID, or the whole Experiment (None) when that is most of it."""
        return None if len(uids) > REFETCH_ALL_SHARE * len(rows) else uids

    @staticmethod
    def _settle(cache: _TrialCache, rows: list[TrialRow], watched: list[str], stats: dict, changed: set[str],
                now: float) -> None:
        """A finished trial whose results stayed the same for SETTLE_SECONDS is no longer
        counted on each look (a finished Experiment then costs one read of its trial
        rows).  Its results may trail its final status by a writer batch, hence the wait;
        a change of its row (a retry) watches it again."""
        finished = {r.uid for r in rows if r.phase in FINISHED_PHASES}
        for trial_uid in watched:
            if trial_uid in changed or trial_uid not in finished:
                cache.quiet_since.pop(trial_uid, None)
                cache.settled.discard(trial_uid)
            elif now - cache.quiet_since.setdefault(trial_uid, now) >= SETTLE_SECONDS:
                cache.settled.add(trial_uid)
            if trial_uid in stats:
                cache.stats[trial_uid] = stats[trial_uid]
            else:
                cache.stats.pop(trial_uid, None)

    # ------------------------------------------------------------------ what a study is made of (snapshot.py)

    def state_key(self, study_id: int) -> str | None:
        """A digest of everything the study's trials are made of, read from the store now:
        its Experiment row, its trial rows and every trial's result count and seqs (the
        rows only grow, so an equal digest means the same trials).  None: no such study."""
        study = self.studies().get(study_id)
        if study is None or self.store is None:
            return None
        rows = self.store.trials(study.row.uid)
        return _digest(study, rows, _counts(self.store.result_stats(study.row.uid)))

    def kept_key(self, study_id: int, trials: list[FrozenTrial]) -> str | None:
        """``state_key`` of the state ``trials`` were made from, when they are this
        storage's current trials of the study (the same objects), else None."""
        study = self.studies().get(study_id)
        with self._lock:
            cache = self._caches.get(study_id)
        if study is None or cache is None:
            return None
        with cache.lock:
            if len(trials) != len(cache.trials) or any(a is not b for a, b in zip(trials, cache.trials)):
                return None
            return _digest(study, list(cache.rows.values()), cache.stats)   # what ``trials`` were made from

    # ------------------------------------------------------------------ writes: refused

    create_new_study = delete_study = set_study_user_attr = set_study_system_attr = _read_only
    create_new_trial = set_trial_param = set_trial_state_values = set_trial_intermediate_value = _read_only
    set_trial_user_attr = set_trial_system_attr = _read_only


def _counts(stats: dict[str, tuple[int, int, int]]) -> dict[str, tuple[int, int]]:
    """``ResultsStore.result_stats`` as (results stored, highest seq): what a compact row records."""
    return {uid: (count, high) for uid, (count, _, high) in stats.items()}


def _digest(study: _Study, rows: list[TrialRow], stats: dict[str, tuple]) -> str:
    row = study.row
    state = [study.id, study.name, [row.uid, row.namespace, row.name, row.metric, row.mode, row.phase, row.created,
                                    row.study],
             [[r.uid, r.name, r.index, r.params, r.phase, r.reason, r.best, r.iteration, r.attempt, stats.get(r.uid)]
              for r in rows]]
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def _curves(rows: list[tuple[str, int, float, float]], wanted: set[str]) -> dict[str, Curve]:
    """Trial UID -> its Curve from ``ResultsStore.curves`` rows (in seq order): the first
    value per iteration, as Optuna keeps; the first and last result's times."""
    curves: dict[str, Curve] = {}
    for trial_uid, iteration, at, value in rows:
        curve = curves.get(trial_uid)
        if curve is None:
            if trial_uid not in wanted:
                continue
            curve = curves[trial_uid] = Curve(started=at)
        curve.ended = at
        curve.intermediate.setdefault(iteration, value)
    return curves
