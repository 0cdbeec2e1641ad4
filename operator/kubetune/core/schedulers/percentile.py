"""Percentile stopping, via Optuna's ``PercentilePruner``: after the grace period, a
trial whose best value so far is outside the top ``quantileFraction`` of the completed
trials' values at the same iteration is stopped (0.25: keep the best quarter; 0.5 is the
median rule).  The pruner decides; this file only builds it and says why it stopped a
trial.  Iterations judged and the state kept are the median rule's milestones, so a
Trial's persisted state stays bounded the same way."""
from __future__ import annotations

import optuna

from kubetune.core.schedulers.base import fmt
from kubetune.core.schedulers.median import MIN_COMPLETED_TRIALS, MedianStoppingScheduler, judged_against
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec


class PercentileStoppingScheduler(MedianStoppingScheduler):
    name = "percentile"
    plan_note = "stops trials below a percentile of completed curves, which a plan cannot count ahead: expected shown as worst"

    def __init__(self, spec: ExperimentSpec, searcher: Searcher) -> None:
        super().__init__(spec, searcher)
        self.percentile = 100.0 * spec.scheduler.quantile_fraction
        self.pruner = optuna.pruners.PercentilePruner(
            self.percentile, n_startup_trials=MIN_COMPLETED_TRIALS,
            n_warmup_steps=spec.scheduler.grace_period, interval_steps=1)

    def explain(self, trial: TrialInfo, frozen: optuna.trial.FrozenTrial) -> str:
        judged = judged_against(self, frozen, self.percentile)
        if judged is None:
            return f"reported NaN for {self.metric} at iteration {frozen.last_step}"
        threshold, count, best = judged
        return (f"outside the top {self.percentile:g}% (cut {fmt(threshold)}) of {count} completed trials "
                f"at iteration {frozen.last_step}: best {self.metric} so far {fmt(best)}")
