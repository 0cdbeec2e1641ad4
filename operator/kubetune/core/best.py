"""The Experiment's best trial of its (first) objective: the one place it changes.

Only a result within the constraints can be the best, and a finished trial whose final
results break a constraint is marked infeasible and loses the title (the next best
feasible trial takes it).  With several objectives there is no single best: the
Pareto front (pareto.py) stands instead, and only each trial's own best is kept."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from kubetune.core.trial import TrialInfo
from kubetune.core.types import TrialPhase
from kubetune.core.values import is_finite
from kubetune.spec.model import ExperimentSpec


@dataclasses.dataclass(frozen=True)
class Best:
    value: float
    trial: str
    iteration: int
    params: Mapping[str, Any]


class BestTrial:
    def __init__(self, spec: ExperimentSpec) -> None:
        # what judges a result never changes while the Experiment runs (runner.on_spec_changed)
        self._objective = spec.objective
        self._constraints = spec.constraints
        self._multi_objective = spec.multi_objective
        self.best: Best | None = None

    def feasible(self, latest: Mapping[str, float]) -> bool:
        return all(c.violation(latest.get(c.metric)) <= 0 for c in self._constraints)

    def judge_constraints(self, trial: TrialInfo, trials: Iterable[TrialInfo]) -> None:
        """A finished trial whose final results break a constraint is marked, and can be
        neither the best trial nor on the Pareto front."""
        broken = [c.describe(trial.latest.get(c.metric)) for c in self._constraints
                  if c.violation(trial.latest.get(c.metric)) > 0]
        trial.infeasible = "; ".join(broken)
        if trial.infeasible and self.best is not None and self.best.trial == trial.name:
            self.best = None
            for other in trials:
                if other.infeasible or other.best_value is None or (
                        other.phase is not TrialPhase.SUCCEEDED and not self.feasible(other.latest)):
                    continue
                self.offer(other.best_value, other, other.best_iteration)

    def record_value(self, trial: TrialInfo, value: float, iteration: int) -> None:
        """Best-so-far bookkeeping of the (first) objective: the trial's own best always,
        the experiment's only with one objective (several have a Pareto front instead)
        and only from results within the constraints."""
        if not is_finite(value):        # never best (core/values.py)
            return
        if trial.best_value is None or self._objective.better(value, trial.best_value):
            trial.best_value, trial.best_iteration = value, iteration
        if self._multi_objective or not self.feasible(trial.latest):
            return
        self.offer(value, trial, iteration)

    def offer(self, value: float, trial: TrialInfo, iteration: int) -> None:
        """The experiment's best becomes ``trial``'s ``value`` if that is better: the one
        place the best trial changes, but for a trial found infeasible (reset, above)."""
        if self.best is None or self._objective.better(value, self.best.value):
            self.best = Best(value, trial.name, iteration, dict(trial.params))


def best_text(spec: ExperimentSpec, best: Best | None, outcomes: Any, trials: Iterable[TrialInfo]) -> str:
    """The best result in words for the Experiment's finishing message (``outcomes``: the
    Pareto front's summary, with several objectives)."""
    if spec.multi_objective:
        return f"Pareto front of {outcomes.front_size if outcomes else 0} trials"
    if best is None:
        metric = spec.objective.metric
        # reported, but never a finite value: say so, not that nothing came
        nonfinite = sum(1 for t in trials if t.last_value is not None)
        if nonfinite:
            return (f"no best {metric}: every value the {nonfinite} trial{'s' * (nonfinite != 1)} reported was NaN or ±Infinity, "
                    f"and a non-finite value never counts as best (diverging training? narrow the "
                    f"search space, e.g. lower learning rates, or report a finite {metric})")
        return f"no trial reported {metric}"
    return f"best {spec.objective.metric} {best.value:.6g} ({best.trial}, iteration {best.iteration})"
