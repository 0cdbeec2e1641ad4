"""Median stopping, via Optuna's ``MedianPruner``: after the grace period, a trial whose
best value so far is worse than the median of the completed trials' values at the same
iteration is stopped."""
from __future__ import annotations

import math

import numpy as np
import optuna
from optuna.trial import TrialState

from kubetune.core.schedulers.base import CONTINUE, PrunerScheduler, SchedulerDecision, fmt
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec

# Completed trials needed before anything is judged (Ray Tune's min_samples_required):
# a median of one or two curves stops good trials on noise.
MIN_COMPLETED_TRIALS = 3


# Iterations after the grace period at which trials are judged: every one of the first
# DENSE_STEPS, then those with at most 5 significant bits past the grace period (34, 36,
# ...; 64, 68, ...): about 16 per doubling, ~190 by iteration 30,000.  The study keeps
# each trial's values at these steps only, so a Trial's persisted state is bounded and a
# restarted operator compares against exactly the values it compared against before.
DENSE_STEPS = 32


def is_milestone(step: int, grace_period: int) -> bool:
    past = step - grace_period
    if past < 0:
        return False
    return past < DENSE_STEPS or past % (1 << (past.bit_length() - 5)) == 0


class MedianStoppingScheduler(PrunerScheduler):
    name = "median"
    plan_note = "stops trials below the median of completed curves, which a plan cannot count ahead: expected shown as worst"

    def __init__(self, spec: ExperimentSpec, searcher: Searcher) -> None:
        super().__init__(spec, searcher, optuna.pruners.MedianPruner(
            n_startup_trials=MIN_COMPLETED_TRIALS, n_warmup_steps=spec.scheduler.grace_period, interval_steps=1))
        self.grace_period = spec.scheduler.grace_period
        searcher.keep_step = self.is_milestone

    def is_milestone(self, step: int) -> bool:
        return is_milestone(step, self.grace_period)

    def on_trial_result(self, trial: TrialInfo, value: float) -> SchedulerDecision:
        if not self.is_milestone(trial.iteration):
            return CONTINUE
        return super().on_trial_result(trial, value)

    def explain(self, trial: TrialInfo, frozen: optuna.trial.FrozenTrial) -> str:
        judged = judged_against(self, frozen, 50.0)
        if judged is None:
            return f"reported NaN for {self.metric} at iteration {frozen.last_step}"
        median, count, best = judged
        return (f"below median {fmt(median)} of {count} completed trials at iteration {frozen.last_step}: "
                f"best {self.metric} so far {fmt(best)}")


def judged_against(scheduler: PrunerScheduler, frozen: optuna.trial.FrozenTrial,
                   percentile: float) -> tuple[float, int, float] | None:
    """What Optuna's PercentilePruner compared at the trial's latest step: the
    ``percentile`` of the completed trials' values there (counted from the best end, as
    the pruner does), how many there were, and the trial's best value so far; None when
    the trial reported only NaN (which the pruner stops outright)."""
    step = frozen.last_step
    values = np.asarray(list(frozen.intermediate_values.values()), dtype=float)
    if np.isnan(values).all():
        return None
    minimize = scheduler.spec.objective.mode == "min"
    best = np.nanmin(values) if minimize else np.nanmax(values)
    completed = scheduler.searcher.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    at_step = [t.intermediate_values[step] for t in completed if step in t.intermediate_values]
    cut = percentile if minimize else 100.0 - percentile
    threshold = float(np.nanpercentile(np.asarray(at_step, dtype=float), cut)) if at_step else math.nan
    return threshold, len(at_step), float(best)
