"""Population Based Training (asynchronous, as in Ray Tune).

Every ``perturbationInterval`` iterations of a trial, it is ranked against the other
live trials by its latest objective value. A trial in the bottom quantile pauses and
continues from the checkpoint of a random trial in the top quantile (exploit) with
that trial's parameters perturbed or resampled (explore). The runner carries out the
restart and records the lineage on the Trial.
"""
from __future__ import annotations

import math
import random
from typing import Any, Iterable, Mapping

from kubetune.core.schedulers.base import CONTINUE, Action, SchedulerDecision, TrialScheduler, fmt
from kubetune.core.schedulers.rungs import Planned, Rung
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo
from kubetune.core.values import judged
from kubetune.spec.model import ExperimentSpec, Param

PERTURBATION_FACTORS = (0.8, 1.2)
NO_CHECKPOINT_WARNING_AFTER = 3     # exploits skipped for want of a donor checkpoint


def perturb(param: Param, value: Any, rng: random.Random) -> Any:
    """Move one value a little: numbers x0.8 or x1.2 within bounds; choices to a neighbour."""
    if param.kind in ("choice", "ordinal"):
        index = next((i for i, c in enumerate(param.choices)
                      if (type(c) is type(value) or param.kind == "ordinal") and c == value), 0)
        index = min(max(index + rng.choice((-1, 1)), 0), len(param.choices) - 1)
        return param.choices[index]
    factor = rng.choice(PERTURBATION_FACTORS)
    moved = value * factor
    if param.kind == "randint":
        stepped = int(round(moved))
        if stepped == value:        # small integers would never move by rounding alone
            stepped = value + (1 if factor > 1 else -1)
        return min(max(stepped, param.low), param.high - 1)
    if param.kind == "quniform":
        return param.nearest_grid_value(moved)
    return min(max(moved, param.low), param.high)


class PBTScheduler(TrialScheduler):
    name = "pbt"

    def __init__(self, spec: ExperimentSpec, searcher: Searcher) -> None:
        super().__init__(spec, searcher)
        sched = spec.scheduler
        self.interval = sched.perturbation_interval
        self.quantile = sched.quantile_fraction
        self.resample_probability = sched.resample_probability
        self._live: dict[str, TrialInfo] = {}
        self._score: dict[str, float] = {}             # latest objective, for ranking
        self._last_perturbation: dict[str, int] = {}   # iteration of the last check
        self._skipped_exploits = 0                     # due, but no donor had a checkpoint

    @classmethod
    def planned(cls, spec: ExperimentSpec, study_name: str) -> Planned:
        """Every trial runs maxIterations: an exploit continues from a donor's checkpoint,
        about as far along, so it changes what runs, not how much.  The rungs are the
        perturbation points, which every trial reaches."""
        sched, trials = spec.scheduler, spec.budget.max_trials
        population = min(spec.budget.parallelism, trials)
        bottom = min(math.ceil(population * sched.quantile_fraction), population // 2)
        points = list(range(sched.perturbation_interval, sched.max_iterations, sched.perturbation_interval))
        rungs = tuple(Rung(step, float(trials), trials) for step in [*points, sched.max_iterations])
        worst = float(trials * sched.max_iterations)
        return Planned(worst, worst, rungs, (f"at each perturbation about {bottom} of the {population} running "
                                             "trials continue from a top trial's checkpoint, redoing the "
                                             "iterations since it was saved",))

    def at_rung(self, iteration: int) -> bool:
        return iteration % self.interval == 0

    def on_trial_add(self, trial: TrialInfo) -> None:
        self._live[trial.name] = trial
        self._last_perturbation.setdefault(trial.name, 0)

    def _forget(self, trial: TrialInfo) -> None:
        self._live.pop(trial.name, None)
        self._score.pop(trial.name, None)

    on_trial_complete = on_trial_error = on_trial_remove = _forget

    def _ranked(self) -> list[TrialInfo]:
        """Live trials with a score, best first; NaN ranks last."""
        sign = 1.0 if self.spec.objective.mode == "min" else -1.0

        def key(t: TrialInfo) -> float:
            score = self._score[t.name]
            return math.inf if math.isnan(score) else sign * score
        return sorted((t for t in self._live.values() if t.name in self._score), key=key)

    def on_trial_result(self, trial: TrialInfo, value: float) -> SchedulerDecision:
        self._score[trial.name] = value
        if trial.iteration - self._last_perturbation.get(trial.name, 0) < self.interval:
            return CONTINUE
        self._last_perturbation[trial.name] = trial.iteration
        ranked = self._ranked()
        size = min(math.ceil(len(ranked) * self.quantile), len(ranked) // 2)
        if size == 0 or trial not in ranked[-size:]:
            return CONTINUE
        donors = [t for t in ranked[:size] if t.checkpoint is not None]
        if not donors:
            self._skipped_exploits += 1
            return CONTINUE        # nothing to copy yet; judged again next interval
        # Random choices drawn from (seed, trial, iteration): the same after an operator
        # restart as without one.
        rng = random.Random(f"{self.spec.search.seed}/{trial.name}/{trial.iteration}")
        donor = rng.choice(donors)
        new_params = self.explore(donor.params, rng)
        # The restarted trial continues from the donor's checkpoint iteration.
        self._last_perturbation[trial.name] = donor.checkpoint_iteration
        changes = ", ".join(f"{k}={_short(v)}" for k, v in new_params.items() if donor.params.get(k) != v)
        return SchedulerDecision(
            Action.PAUSE, "Exploit",
            f"bottom {self.quantile:.0%} at iteration {trial.iteration} ({self.metric} {fmt(value)}); "
            f"continuing from {donor.name} at iteration {donor.checkpoint_iteration} "
            f"({self.metric} {fmt(self._score[donor.name])})" + (f" with {changes}" if changes else ""),
            clone_from=donor.name, new_params=new_params)

    def warning(self) -> str:
        # One skipped exploit is normal early on; several mean the function saves nothing.
        if self._skipped_exploits < NO_CHECKPOINT_WARNING_AFTER:
            return ""
        return (f"PBT skipped {self._skipped_exploits} exploits: no trial in the top {self.quantile:.0%} has a "
                "checkpoint to continue from; save one with kubetune.report(metrics, checkpoint=directory) "
                "at least every perturbationInterval iterations")

    def explore(self, params: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
        explored = {}
        # the searcher's space: a warm-start bounding box bounds exploration too
        for name, param in self.searcher.space.items():
            if name not in params or rng.random() < self.resample_probability:
                explored[name] = self.searcher.resample(name, rng)
            else:
                explored[name] = perturb(param, params[name], rng)
        return explored

    def trial_state(self, trial: TrialInfo) -> dict[str, Any]:
        if trial.name not in self._live:
            return {}
        return {"lastPerturbation": self._last_perturbation.get(trial.name, 0)}

    def restore(self, trials: Iterable[TrialInfo], states: Mapping[str, Mapping[str, Any]]) -> None:
        for trial in trials:
            if trial.phase.is_terminal:
                continue
            self._live[trial.name] = trial
            if trial.last_value is not None:
                self._score[trial.name] = judged(trial.last_value)
            recorded = (states.get(trial.name) or {}).get("lastPerturbation")
            if isinstance(recorded, int):
                self._last_perturbation[trial.name] = recorded
                continue
            last = trial.lineage[-1]["iteration"] if trial.lineage else 0
            # A Trial from before the state was recorded: assume a check at the last boundary.
            self._last_perturbation[trial.name] = max(last, trial.iteration // self.interval * self.interval)


def _short(value: Any) -> str:
    return fmt(value) if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)
