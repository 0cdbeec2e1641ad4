"""``warmStart.searchSpace: boundingBox``: search only the smallest box that holds the
best trials of the earlier Experiments (Perrone et al., "Learning search spaces for
Bayesian optimization: another view of hyperparameter transfer learning", NeurIPS 2019;
Syne Tune's ``BoundingBox`` transfer-learning scheduler).

The paper boxes the best configuration of each earlier task; with one earlier
Experiment that is a single point, so each Experiment contributes its "good" trials as
TPE counts them (Optuna's ``default_gamma``: the best 10%, at most 25; at least 2, so
one Experiment still spans a region). With several objectives the good trials are the
feasible non-dominated ones (Optuna's Pareto test). Infeasible trials are never good.

A numeric parameter's range becomes the lowest to highest value the good trials took,
a choice keeps the values they took (in the spec's order). ``spec.search.initialPoints``
are put in the box too: they are asked as given. Earlier trials outside the box cannot
be represented in it and do not seed the study (the paper's BO sees only the box).

The box is a function of the warm-start set only, which the controller fixes at the
first start (controller/warm_start.py), so a restarted operator searches the same box
while every source Experiment exists. The box itself is not stored: a source deleted or
re-created since seeds nothing after a restart, so the box is recomputed from the
remaining sources (or is None: the full space), and restored trials of this Experiment
outside it become parameterless FAIL placeholders in the study (core/search.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kubetune.core.optuna_compat import default_gamma, is_pareto_front
from kubetune.spec.model import ExperimentSpec, Param

MIN_GOOD = 2                 # one trial would make the box a point
MAX_DESCRIPTION_CHARS = 600  # the WarmStarted condition carries it


@dataclass(frozen=True)
class Box:
    space: dict[str, Param]      # the narrowed search space, in the spec's order
    good: int                    # the earlier trials that span it
    description: str             # for the WarmStarted condition: the box, in the user's terms


def _good_of_one(trials: Sequence[Any], spec: ExperimentSpec) -> list[Any]:
    """The good trials of one earlier Experiment (``trials`` are WarmTrials)."""
    feasible = [t for t in trials if all(c.violation(_number(t.metrics, c.metric)) <= 0 for c in spec.constraints)]
    if not feasible:
        return []
    losses = np.asarray([[t.metrics[o.metric] if o.mode == "min" else -t.metrics[o.metric] for o in spec.objectives]
                         for t in feasible], dtype=float)
    if spec.multi_objective:
        return [t for t, on_front in zip(feasible, is_pareto_front(losses, assume_unique_lexsorted=False))
                if on_front]
    count = max(MIN_GOOD, default_gamma(len(trials)))
    order = sorted(range(len(feasible)), key=lambda i: (losses[i][0], i))
    return [feasible[i] for i in order[:count]]


def _number(metrics: Mapping[str, Any], name: str) -> float | None:
    value = metrics.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _narrow(param: Param, values: list[Any]) -> Param:
    if param.kind == "choice":
        return dataclasses.replace(param, choices=tuple(c for c in param.choices if any(
            type(c) is type(v) and c == v for v in values)))
    low, high = min(values), max(values)
    if param.kind == "ordinal":
        kept = tuple(c for c in param.choices if low <= c <= high)
        return dataclasses.replace(param, low=low, high=high, choices=kept)
    if param.kind == "randint":
        return dataclasses.replace(param, low=int(low), high=int(high) + 1)   # high stays exclusive
    return dataclasses.replace(param, low=low, high=high)    # quniform: both are on its grid


def _show(name: str, param: Param) -> str:
    if param.kind in ("choice", "ordinal"):
        return f"{name} in {{{', '.join(map(str, param.choices))}}}"
    high = param.high - 1 if param.kind == "randint" else param.high
    return f"{name} in [{param.low:.6g}, {high:.6g}]"


def bounding_box(spec: ExperimentSpec, warm: Sequence[Any]) -> tuple[Box | None, str]:
    """The box of ``warm`` (usable WarmTrials, values inside the spec's space), or None
    and why the full space is searched instead."""
    by_experiment: dict[str, list[Any]] = {}
    for trial in warm:
        by_experiment.setdefault(trial.source.split("/", 1)[0], []).append(trial)
    good = [t for trials in by_experiment.values() for t in _good_of_one(trials, spec)]
    if not good:
        return None, "bounding box: no feasible earlier trial; the whole search space is searched"
    points: list[Mapping[str, Any]] = [t.params for t in good] + list(spec.search.initial_points)
    space = {name: _narrow(param, [p[name] for p in points]) for name, param in spec.search_space.items()}
    if all(_single(param) for param in space.values()):
        return None, ("bounding box: the best earlier trials are one configuration; "
                      "the whole search space is searched")
    shown = "; ".join(_show(name, param) for name, param in space.items())
    description = (f"searching the bounding box of the best {len(good)} earlier trials: {shown}")
    if len(description) > MAX_DESCRIPTION_CHARS:
        description = description[:MAX_DESCRIPTION_CHARS - 3] + "..."
    return Box(space, len(good), description), ""


def _single(param: Param) -> bool:
    if param.kind in ("choice", "ordinal"):
        return len(param.choices) == 1
    return param.grid_size() == 1 if param.kind in ("randint", "quniform") else param.low == param.high
