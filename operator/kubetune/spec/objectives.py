"""The parts of an Experiment spec about what is optimised and what is already known:
``objective`` or ``objectives``, ``constraints``, ``warmStart`` and
``search.initialPoints``. Kept apart from ``parse.py`` so each stays readable; the
helpers are the same ones (spec/fields.py)."""
from __future__ import annotations

import re
from typing import Any, Mapping

from kubetune.spec.fields import integer, is_number, mapping, number, only_keys
from kubetune.spec.model import (
    SINGLE_OBJECTIVE_ALGORITHMS, WARM_START_SPACES, Constraint, Objective, Param, SpecError, WarmStart,
)

MAX_OBJECTIVES = 8
MAX_CONSTRAINTS = 16
MAX_WARM_START_EXPERIMENTS = 16
MAX_INITIAL_POINTS = 256
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _items(raw: Any, path: str, limit: int, example: str) -> list[Any]:
    """A list field: () when absent, else a non-empty list of at most ``limit`` items."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        raise SpecError(path, f"expected a non-empty list, e.g. {example}")
    if len(raw) > limit:
        raise SpecError(path, f"at most {limit} items (got {len(raw)})")
    return raw


def _metric(obj: Mapping[str, Any], where: str) -> str:
    metric = obj.get("metric")
    if not isinstance(metric, str) or not metric:
        raise SpecError(f"{where}.metric", "required: the name of a metric your function reports")
    return metric


def objectives(root: Mapping[str, Any], single) -> tuple[tuple[Objective, ...], tuple[float, ...] | None]:
    """``spec.objective`` (parsed by ``single``) or ``spec.objectives``: exactly one of them.
    Returns the objectives and the hypervolume reference point (None unless every
    objective names its ``reference``)."""
    if root.get("objective") is not None and root.get("objectives") is not None:
        raise SpecError("spec.objectives", "set either objective (one metric) or objectives (several), not both")
    if root.get("objectives") is None:
        return (single(root.get("objective")),), None
    path = "spec.objectives"
    raw = _items(root["objectives"], path, MAX_OBJECTIVES,
                 "[{metric: loss, mode: min}, {metric: model_size, mode: min}]")
    parsed: list[Objective] = []
    references: list[float | None] = []
    for position, item in enumerate(raw):
        where = f"{path}[{position}]"
        obj = mapping(item, where, required=True)
        only_keys(obj, where, ("metric", "mode", "reference"))
        metric = _metric(obj, where)
        if any(o.metric == metric for o in parsed):
            raise SpecError(f"{where}.metric", f"{metric!r} is already an objective")
        if obj.get("mode") not in ("min", "max"):
            raise SpecError(f"{where}.mode", f"must be min or max (got {obj.get('mode')!r})")
        parsed.append(Objective(metric=metric, mode=obj["mode"]))
        references.append(number(obj, "reference", where, None))
    given = [r for r in references if r is not None]
    if given and len(given) != len(references):
        missing = next(i for i, r in enumerate(references) if r is None)
        raise SpecError(f"{path}[{missing}].reference", "the hypervolume needs a reference value for every "
                                                         "objective, or for none")
    return tuple(parsed), (tuple(given) if given else None)


def constraints(raw: Any) -> tuple[Constraint, ...]:
    path = "spec.constraints"
    parsed = []
    for position, item in enumerate(_items(raw, path, MAX_CONSTRAINTS, "[{metric: memory_gb, max: 16}]")):
        where = f"{path}[{position}]"
        obj = mapping(item, where, required=True)
        only_keys(obj, where, ("metric", "max", "min"))
        metric = _metric(obj, where)
        high, low = number(obj, "max", where, None), number(obj, "min", where, None)
        if high is None and low is None:
            raise SpecError(where, "needs max or min (or both), e.g. {metric: latency_ms, max: 20}")
        if high is not None and low is not None and low > high:
            raise SpecError(f"{where}.min", f"must be <= max ({high:g}) (got {low:g})")
        parsed.append(Constraint(metric=metric, max=high, min=low))
    return tuple(parsed)


def warm_start(raw: Any) -> WarmStart | None:
    path = "spec.warmStart"
    if raw is None:
        return None
    obj = mapping(raw, path)
    only_keys(obj, path, ("experiments", "maxTrials", "searchSpace"))
    names = obj.get("experiments")
    if not isinstance(names, list) or not names:
        raise SpecError(f"{path}.experiments", "required: the names of earlier Experiments in this namespace")
    if len(names) > MAX_WARM_START_EXPERIMENTS:
        raise SpecError(f"{path}.experiments", f"at most {MAX_WARM_START_EXPERIMENTS} (got {len(names)})")
    for position, name in enumerate(names):
        if not isinstance(name, str) or len(name) > 63 or not _NAME.match(name):
            raise SpecError(f"{path}.experiments[{position}]", f"not an Experiment name: {name!r}")
    space = obj.get("searchSpace", "full")
    if space not in WARM_START_SPACES:
        raise SpecError(f"{path}.searchSpace", f"one of {', '.join(WARM_START_SPACES)} (got {space!r})")
    return WarmStart(experiments=tuple(names), max_trials=integer(obj, "maxTrials", path, 1000, 1), search_space=space)


def initial_points(raw: Any, space: Mapping[str, Param]) -> tuple[Mapping[str, Any], ...]:
    """``spec.search.initialPoints``: complete parameter sets, each inside the search space."""
    path = "spec.search.initialPoints"
    points = []
    for position, item in enumerate(_items(raw, path, MAX_INITIAL_POINTS, "[{lr: 0.01, batch_size: 64}]")):
        where = f"{path}[{position}]"
        point = mapping(item, where, required=True)
        for name in point:
            if name not in space:
                raise SpecError(f"{where}.{name}", f"not a parameter of searchSpace "
                                                   f"(known: {', '.join(sorted(space))})")
        for name, param in space.items():
            if name not in point:
                raise SpecError(f"{where}.{name}", "missing: an initial point gives every searchSpace parameter")
            value = point[name]
            if param.kind == "choice":
                if not param.contains(value):
                    raise SpecError(f"{where}.{name}", f"{repr(value)[:100]} is not one of "
                                                       f"{list(param.choices)[:10]}{' ...' if len(param.choices) > 10 else ''}")
                continue
            if not is_number(value) or not param.contains(value):
                allowed = {"randint": f"an integer in [{param.low}, {param.high})",
                           "quniform": f"a multiple of {param.q} from {param.low} to {param.high}",
                           "ordinal": f"one of {list(param.choices)[:10]}"
                                      f"{' ...' if len(param.choices) > 10 else ''}"}.get(
                    param.kind, f"in [{param.low:g}, {param.high:g}]")
                raise SpecError(f"{where}.{name}", f"{repr(value)[:100]} is outside the search space: "
                                                   f"use {allowed}")
        points.append(dict(point))
    return tuple(points)


def check_multi_objective(count: int, algorithm: str) -> None:
    """Several objectives need a sampler that can rank vectors (and a scheduler that
    can: core.schedulers.scheduler_class)."""
    if count < 2:
        return
    if algorithm in SINGLE_OBJECTIVE_ALGORITHMS:
        raise SpecError("spec.search.algorithm", f"{algorithm} searches one objective only; with several "
                                                 f"objectives use nsgaii, tpe or random")
