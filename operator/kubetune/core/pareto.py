"""What an Experiment learned beyond one best trial: the Pareto front of several
objectives, its hypervolume as trials finished, the reused and warm-start trials.

Computed from the searcher's Optuna study with Optuna's own non-dominated sorting and
hypervolume (no hand-written multi-objective algorithm), bounded, and recomputed only
when a trial finished (``FrontCache``), since a summary is rendered every second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from optuna.study import StudyDirection
from optuna.trial import TrialState

from kubetune.core.optuna_compat import compute_hypervolume, pareto_front_trials
from kubetune.core.samplers import from_study

if TYPE_CHECKING:
    from kubetune.core.runner import TrialRunner

MAX_FRONT_POINTS = 50          # the core keeps this many; the Experiment shows fewer (bytes)
HYPERVOLUME_POINTS = 20        # the history is sampled at this many trial counts at most
MAX_REUSED_LISTED = 10
MAX_WARM_START_PROBLEMS = 5


@dataclass(frozen=True)
class FrontPoint:
    trial: str
    params: Mapping[str, Any]
    values: Mapping[str, float]          # objective metric -> value


@dataclass(frozen=True)
class Outcomes:
    front_size: int | None = None                  # None: one objective (no front)
    front: tuple[FrontPoint, ...] = ()             # sorted by the first objective, best first
    hypervolume: tuple[tuple[int, float], ...] = ()   # (finished trials, hypervolume), bounded
    reused_count: int = 0
    reused: tuple[tuple[str, str], ...] = ()       # (trial, source), the first few
    warm_start_used: int = 0
    warm_start_problems: tuple[str, ...] = ()
    warm_start_skipped: int = 0
    warm_start_region: str = ""                    # warmStart.searchSpace: boundingBox, in words


def _loss(values, directions) -> list[float]:
    """Every objective as one to minimise, as Optuna's helpers expect."""
    return [v if d == StudyDirection.MINIMIZE else -v for v, d in zip(values, directions)]


def hypervolume_history(losses: list[list[float]], reference: list[float]) -> list[tuple[int, float]]:
    """Hypervolume of the first k finished trials, for at most HYPERVOLUME_POINTS values
    of k (evenly spaced, always including all of them). Points not better than the
    reference in every objective add nothing and are left out."""
    total = len(losses)
    if total == 0:
        return []
    ref = np.asarray(reference, dtype=float)
    counts = sorted({math.ceil(total * j / HYPERVOLUME_POINTS) for j in range(1, HYPERVOLUME_POINTS + 1)})
    history = []
    for count in counts:
        inside = [point for point in losses[:count] if all(p < r for p, r in zip(point, ref))]
        volume = float(compute_hypervolume(np.asarray(inside), ref)) if inside else 0.0
        history.append((count, volume))
    return history


def compute(runner: "TrialRunner") -> Outcomes:
    spec, searcher = runner.spec, runner.searcher
    reused = [t for t in runner.trials.values() if t.reason == "Reused"]
    base = dict(reused_count=len(reused),
                reused=tuple((t.name, t.message.split(":", 1)[0].removeprefix("same parameters as "))
                             for t in reused[:MAX_REUSED_LISTED]),
                warm_start_used=searcher.warm_start_used,
                warm_start_problems=tuple(searcher.warm_start_problems[:MAX_WARM_START_PROBLEMS]),
                warm_start_skipped=len(searcher.warm_start_problems),
                warm_start_region=searcher.warm_start_region)
    if not spec.multi_objective:
        return Outcomes(**base)
    study = searcher.study
    # this Experiment's finished trials only: warm-start trials inform the sampler, not the front
    finished = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if searcher.index_of(t) is not None]
    finished.sort(key=lambda t: t.number)
    front = pareto_front_trials(finished, study.directions, consider_constraint=True)
    directions = study.directions
    front.sort(key=lambda t: (_loss(t.values, directions), t.number))
    names = [o.metric for o in spec.objectives]
    points = tuple(FrontPoint(trial=f"{runner.experiment}-{searcher.index_of(t)}",
                              params=from_study(searcher.space, t.params),
                              values=dict(zip(names, t.values))) for t in front[:MAX_FRONT_POINTS])
    history: list[tuple[int, float]] = []
    if spec.reference_point is not None:
        feasible = [t for t in finished if all(c <= 0 for c in t.constraints.values())]
        history = hypervolume_history([_loss(t.values, directions) for t in feasible],
                                      _loss(spec.reference_point, directions))
    return Outcomes(front_size=len(front), front=points, hypervolume=tuple(history), **base)


@dataclass
class FrontCache:
    """``compute`` once per change: the runner calls ``changed`` when a trial finishes."""
    version: int = 0
    _computed: tuple[int, Outcomes] | None = field(default=None)

    def changed(self) -> None:
        self.version += 1

    def get(self, runner: "TrialRunner") -> Outcomes:
        if self._computed is None or self._computed[0] != self.version:
            self._computed = (self.version, compute(runner))
        return self._computed[1]
