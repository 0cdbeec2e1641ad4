"""MO-ASHA: asynchronous successive halving on several objectives (Syne Tune's MOASHA,
Salinas et al. 2021), with the promotion rule of single-objective ASHA.

Rungs sit at gracePeriod x reductionFactor^k iterations, as in ``asha.py``. A trial
reaching a rung records its objective vector there; the vectors recorded at that rung
(its own included) are ranked by Optuna's non-dominated sorting, and the trial
continues only if its rank is no worse than the rank at position
max(n // reductionFactor - 1, 0) of the sorted ranks: with one objective the rank
order is the value order, so this is exactly SuccessiveHalvingPruner's rule (the first
trial at a rung continues). Optuna's pruners cannot be used: a multi-objective study
keeps no intermediate values.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np

from kubetune.core.optuna_compat import fast_non_domination_rank
from kubetune.core.schedulers.asha import ASHAScheduler
from kubetune.core.schedulers.base import CONTINUE, Action, SchedulerDecision, TrialScheduler, fmt
from kubetune.core.schedulers.rungs import Planned
from kubetune.core.search import Searcher
from kubetune.core.search_values import latest_values
from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec


class MOASHAScheduler(TrialScheduler):
    name = "asha"             # asha with several objectives
    objectives = ("multi",)
    requires_max_iterations = True

    def __init__(self, spec: ExperimentSpec, searcher: Searcher) -> None:
        super().__init__(spec, searcher)
        self._metrics = [o.metric for o in spec.objectives]
        self._signs = [1.0 if o.mode == "min" else -1.0 for o in spec.objectives]
        self._rungs: dict[int, dict[str, list[float]]] = {}     # rung -> trial -> loss vector there
        self._reached: dict[str, int] = {}                       # trial -> rungs recorded

    @classmethod
    def planned(cls, spec: ExperimentSpec, study_name: str) -> Planned:
        """The same rungs and promotion rule as single-objective ASHA."""
        return ASHAScheduler.planned(spec, study_name)

    def milestone(self, rung: int) -> int:
        sched = self.spec.scheduler
        return sched.grace_period * sched.reduction_factor ** rung

    def on_trial_result(self, trial: TrialInfo, value: float) -> SchedulerDecision:
        vector = [trial.latest.get(metric) for metric in self._metrics]
        if any(v is None for v in vector):
            return CONTINUE          # judged once every objective has been reported
        return self._judge(trial.name, trial.iteration, vector)

    def _judge(self, name: str, iteration: int, vector: list[float]) -> SchedulerDecision:
        rung = self._reached.get(name, 0)
        while iteration >= self.milestone(rung):
            if not all(math.isfinite(v) for v in vector):   # the worst value (core/values.py)
                return SchedulerDecision(Action.STOP, "EarlyStopped",
                                         f"reported a non-finite value for an objective at iteration {iteration}")
            loss = [sign * v for sign, v in zip(self._signs, vector)]
            recorded = self._rungs.setdefault(rung, {})
            recorded[name] = loss
            self._reached[name] = rung + 1
            promotable, detail = self._promotable(recorded, name)
            if not promotable:
                return SchedulerDecision(Action.STOP, "EarlyStopped",
                                         f"at rung {rung} (iteration {self.milestone(rung)}) {detail}")
            rung += 1
        return CONTINUE

    def _promotable(self, recorded: dict[str, list[float]], name: str) -> tuple[bool, str]:
        names = list(recorded)
        ranks = fast_non_domination_rank(np.asarray([recorded[n] for n in names], dtype=float))
        rf = self.spec.scheduler.reduction_factor
        index = max(len(names) // rf - 1, 0)
        cutoff = int(np.sort(ranks)[index])
        own = int(ranks[names.index(name)])
        values = ", ".join(f"{m} {fmt(s * v)}" for m, s, v in zip(self._metrics, self._signs, recorded[name]))
        return own <= cutoff, (f"({values}) has non-dominated rank {own}, behind the top 1/{rf} of the "
                               f"{len(names)} trials that reached it (cutoff rank {cutoff})")

    def trial_state(self, trial: TrialInfo) -> dict[str, Any]:
        """The trial's vector (as losses) at each rung it reached: a few numbers per rung,
        all a restart needs to take the same decisions."""
        reached = self._reached.get(trial.name, 0)
        return {"rungs": [self._rungs[rung][trial.name] for rung in range(reached)]} if reached else {}

    def restore(self, trials: Iterable[TrialInfo], states: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """From each trial's ``trial_state`` when persisted, else by replaying its history:
        a trial records its vector at each rung it reached whatever the others did, so the
        recorded rungs (all later decisions depend on) do not depend on the order trials
        reported in."""
        for trial in sorted(trials, key=lambda t: t.index):
            rungs = (states or {}).get(trial.name, {}).get("rungs")
            if rungs:
                for rung, loss in enumerate(rungs):
                    self._rungs.setdefault(rung, {})[trial.name] = [float(v) for v in loss]
                self._reached[trial.name] = len(rungs)
                continue
            latest: dict[str, float] = {}
            for position, metrics in enumerate(trial.history, start=1):
                latest.update(latest_values([metrics], self._metrics))
                if len(latest) < len(self._metrics):
                    continue
                decision = self._judge(trial.name, metrics.get("iteration", position),
                                       [latest[m] for m in self._metrics])
                if decision.action is Action.STOP:
                    break
