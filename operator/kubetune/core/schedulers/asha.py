"""ASHA: asynchronous successive halving, via Optuna's ``SuccessiveHalvingPruner``.

Rungs sit at gracePeriod x reductionFactor^k iterations. A trial reaching a rung is
compared with every trial that reached it before; it continues only if it is in the
top 1/reductionFactor of them (Optuna lets the first trials at a rung through when
they are the best so far, since nothing can be resumed later).
"""
from __future__ import annotations

import bisect
import math
from typing import Any, Iterable, Mapping

import optuna
from optuna.study import StudyDirection

from kubetune.core import optuna_compat
from kubetune.core.schedulers.base import PrunerScheduler, fmt
from kubetune.core.schedulers.rungs import Planned, successive_halving
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec

# The key SuccessiveHalvingPruner stores a trial's value at rung k under (system attrs).
RUNG_KEY = "completed_rung_{}"


class _RungEntry:
    """One trial as the pruner's competitor scan sees it: just its recorded rung values."""
    __slots__ = ("system_attrs",)

    def __init__(self) -> None:
        self.system_attrs: dict[str, float] = {}


class _CompetitorsStudy:
    """What ``SuccessiveHalvingPruner.prune`` reads from a study (direction, storage,
    get_trials), listing only the trials that completed the judged trial's current rung.

    The pruner scans every listed trial for each rung decision; listing all trials made a
    10,000-trial experiment quadratic in FrozenTrial attribute reads. Only trials with a
    value at rung r can compete at rung r or above, so the decision is unchanged (Optuna's
    HyperbandPruner filters a study the same way for its brackets).
    """

    def __init__(self, study: optuna.Study, competitors: list[_RungEntry]) -> None:
        self._storage = optuna_compat.storage(study)   # the pruner reads it by this (private) name
        self.direction = study.direction
        self._competitors = competitors

    def get_trials(self, deepcopy: bool = False, states: object = None) -> list[_RungEntry]:
        return self._competitors


class ASHAScheduler(PrunerScheduler):
    name = "asha"
    requires_max_iterations = True
    replays_history = True     # only Trials from before the bounded state (see restore)

    def __init__(self, spec: ExperimentSpec, searcher: Searcher, pruner: optuna.pruners.BasePruner | None = None) -> None:
        sched = spec.scheduler
        super().__init__(spec, searcher, pruner or optuna.pruners.SuccessiveHalvingPruner(
            min_resource=sched.grace_period, reduction_factor=sched.reduction_factor, min_early_stopping_rate=0))
        self._entries: dict[int, _RungEntry] = {}              # trial id -> its rung values
        # Per (bracket, rung): the entries that reached it and their values there, both
        # sorted by value, so the cutoff a stop message names is a lookup.
        self._reached: dict[tuple[int, int], list[_RungEntry]] = {}
        self._rung_values: dict[tuple[int, int], list[float]] = {}

    @classmethod
    def planned(cls, spec: ExperimentSpec, study_name: str) -> Planned:
        """Successive halving, played out in each bracket (core/schedulers/rungs.py); at worst every
        trial is the best so far at every rung and none stops early."""
        sched = spec.scheduler
        expected, rungs = successive_halving(cls.trial_brackets(spec, study_name), sched.grace_period, sched.reduction_factor,
                                             sched.max_iterations, spec.budget.parallelism)
        notes = ["expected: trials of random quality whose rank holds from rung to rung; where curves cross, "
                 "fewer continue and it costs less"]
        if spec.search.algorithm not in ("random", "grid", "qmc"):
            notes.append(f"{spec.search.algorithm} improves as it learns, so more trials continue: the cost lies "
                         "between expected and worst")
        return Planned(float(spec.budget.max_trials * sched.max_iterations), expected, tuple(rungs), tuple(notes))

    @classmethod
    def trial_brackets(cls, spec: ExperimentSpec, study_name: str) -> list[int]:
        """The bracket of each trial, in creation order (ASHA: one bracket)."""
        return [0] * spec.budget.max_trials

    def at_rung(self, iteration: int) -> bool:
        return self._rung_index(iteration) > self._rung_index(iteration - 1)

    def replay_step(self, previous: int | None, step: int) -> bool:
        """Successive halving acts only at the first step at or past a rung (gracePeriod x
        reductionFactor^k, in every bracket): replay those, a few per trial."""
        return self._rung_index(step) > (self._rung_index(previous) if previous is not None else -1)

    def _rung_index(self, step: int) -> int:
        """How many rung milestones lie at or below ``step``."""
        grace, rf = self.spec.scheduler.grace_period, self.spec.scheduler.reduction_factor
        index, milestone = 0, grace
        while milestone <= step:
            index, milestone = index + 1, milestone * rf
        return index

    def restore(self, trials: Iterable[TrialInfo], states: Mapping[str, Mapping[str, Any]]) -> None:
        """The rung tables from the rung values the rebuilt study holds (persisted on each
        Trial): O(trials x rungs), no replay (issue 15: a replay was O(results^2) per
        trial); Trials from before the bounded state are replayed (PrunerScheduler)."""
        storage = optuna_compat.storage(self.searcher.study)
        for trial in sorted(trials, key=lambda t: t.index):
            if trial.name in self.searcher.restored_bounded:
                self._record_rungs(storage.get_trial(self.searcher.trial_id(trial.index)))
        super().restore(trials, states)

    def bracket(self, frozen: optuna.trial.FrozenTrial) -> int:
        """The successive-halving bracket the trial competes in (its early-stopping rate)."""
        return 0

    def prune(self, frozen: optuna.trial.FrozenTrial) -> bool:
        entry = self._entries.get(optuna_compat.trial_id(frozen))
        rung = len(entry.system_attrs) if entry else 0
        competitors = self._reached.get((self.bracket(frozen), rung), [])
        pruned = self.pruner.prune(_CompetitorsStudy(self.searcher.study, competitors), frozen)
        self._record_rungs(frozen)
        return pruned

    def _record_rungs(self, frozen: optuna.trial.FrozenTrial) -> None:
        """Copy the rung values the pruner just stored for this trial."""
        attrs = optuna_compat.storage(self.searcher.study).get_trial(optuna_compat.trial_id(frozen)).system_attrs
        entry = self._entries.setdefault(optuna_compat.trial_id(frozen), _RungEntry())
        rung = len(entry.system_attrs)
        bracket = self.bracket(frozen)
        while RUNG_KEY.format(rung) in attrs:
            key = RUNG_KEY.format(rung)
            entry.system_attrs[key] = attrs[key]
            # Both lists stay sorted by value: the pruner sorts the competitors it reads,
            # and sorting an already sorted list is linear.
            values = self._rung_values.setdefault((bracket, rung), [])
            position = bisect.bisect(values, attrs[key])
            values.insert(position, attrs[key])
            self._reached.setdefault((bracket, rung), []).insert(position, entry)
            rung += 1

    def explain(self, trial: TrialInfo, frozen: optuna.trial.FrozenTrial) -> str:
        step = frozen.last_step
        value = frozen.intermediate_values[step]
        if math.isnan(value):
            return f"reported NaN for {self.metric} at iteration {step}"
        # The rung it was judged on is the highest one the pruner recorded for it.
        entry = self._entries[optuna_compat.trial_id(frozen)]
        rung = len(entry.system_attrs) - 1
        bracket = self.bracket(frozen)
        competing = self._rung_values[(bracket, rung)]
        rf = self.spec.scheduler.reduction_factor
        # Same rule as SuccessiveHalvingPruner._is_trial_promotable_to_next_rung.
        index = max(len(competing) // rf - 1, 0)
        if self.searcher.study.direction == StudyDirection.MAXIMIZE:
            cutoff = competing[-(index + 1)]
        else:
            cutoff = competing[index]
        milestone = self.spec.scheduler.grace_period * rf ** (bracket + rung)
        return (f"below rung {rung} cutoff {fmt(cutoff)}: {self.metric} "
                f"{fmt(entry.system_attrs[RUNG_KEY.format(rung)])} at rung iteration {milestone} "
                f"is not in the top 1/{rf} of the {len(competing)} trials that reached it")
