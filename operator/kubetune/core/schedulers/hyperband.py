"""HyperBand, via Optuna's ``HyperbandPruner``: several successive-halving brackets
with different early-stopping rates; each trial is assigned to one bracket (by a hash
of its number) and competes only with the trials in that bracket."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Iterable, Mapping

import optuna

from kubetune.core import optuna_compat
from kubetune.core.schedulers.asha import ASHAScheduler
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec


class HyperBandScheduler(ASHAScheduler):
    name = "hyperband"

    def __init__(self, spec: ExperimentSpec, searcher: Searcher) -> None:
        sched = spec.scheduler
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=sched.grace_period, max_resource=sched.max_iterations,
            reduction_factor=sched.reduction_factor)
        super().__init__(spec, searcher, pruner)

    @classmethod
    def trial_brackets(cls, spec: ExperimentSpec, study_name: str) -> list[int]:
        """The pruner's own assignment of trial numbers 0..maxTrials-1 (a hash of the study
        name, the Experiment's, and the number): known before the run."""
        sched = spec.scheduler
        pruner = optuna.pruners.HyperbandPruner(min_resource=sched.grace_period, max_resource=sched.max_iterations,
                                                reduction_factor=sched.reduction_factor)
        study = SimpleNamespace(study_name=study_name)   # all the pruner reads of a study here
        optuna_compat.hyperband_ready(pruner, study)
        return [optuna_compat.hyperband_bracket(pruner, study, SimpleNamespace(number=number))
                for number in range(spec.budget.max_trials)]

    def bracket(self, frozen: optuna.trial.FrozenTrial) -> int:
        # The pruner's own assignment (a hash of study name and trial number), so the
        # explanation names the bracket the trial was judged in.
        return optuna_compat.hyperband_bracket(self.pruner, self.searcher.study, frozen)

    def restore(self, trials: Iterable[TrialInfo], states: Mapping[str, Mapping[str, Any]]) -> None:
        # the brackets exist once the pruner has judged a trial; a restore judges none
        optuna_compat.hyperband_ready(self.pruner, self.searcher.study)
        super().restore(trials, states)

    def prune(self, frozen: optuna.trial.FrozenTrial) -> bool:
        # HyperbandPruner builds its per-bracket view from the real study itself.
        pruned = self.pruner.prune(self.searcher.study, frozen)
        self._record_rungs(frozen)
        return pruned

    def explain(self, trial: TrialInfo, frozen: optuna.trial.FrozenTrial) -> str:
        return f"{super().explain(trial, frozen)} in bracket {self.bracket(frozen)}"
