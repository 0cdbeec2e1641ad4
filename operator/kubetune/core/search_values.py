"""A trial's reported values as the study, the schedulers and a restart read them: the
objective in one result, the latest value of each metric, the steps a decision can
read (``kept_steps``), and a configuration's identity.  Pure."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

from kubetune.core.types import TrialRecord
from kubetune.core.values import judged


def objective_value(metrics: Mapping[str, Any], metric: str) -> float | None:
    """The objective in one reported metrics dict, or None when absent or not a number."""
    value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def history_values(history: Iterable[Mapping[str, Any]], metric: str) -> dict[int, float]:
    """{iteration: objective as judged} from a history of results (a Trial written by an
    operator that kept full histories), keeping the first value per iteration as Optuna
    does when a retry reports an iteration again."""
    values: dict[int, float] = {}
    for position, metrics in enumerate(history, start=1):
        value = objective_value(metrics, metric)
        iteration = metrics.get("iteration", position)
        if value is not None and isinstance(iteration, int) and iteration not in values:
            values[iteration] = judged(value)
    return values


# The system attributes a pruner decides on (SuccessiveHalvingPruner's rung values).
RUNG_ATTR_PREFIX = "completed_rung_"


def kept_steps(values: Mapping[int, float], minimize: bool, keep_step: Callable[[int], bool] | None) -> set[int]:
    """The steps of ``values`` a decision can read (core/search.py's docstring says which)."""
    if not values:
        return set()
    keep = {max(values)}
    finite = [(v, s) for s, v in values.items() if not math.isnan(v)]
    if finite:
        keep.add((min(finite) if minimize else max(finite, key=lambda p: (p[0], -p[1])))[1])
    if keep_step is not None:
        keep.update(s for s in values if keep_step(s))
    return keep


def latest_values(history: Iterable[Mapping[str, Any]], metrics: Iterable[str]) -> dict[str, float]:
    """The last number reported for each metric (a trial may report some metrics once)."""
    latest: dict[str, float] = {}
    wanted = set(metrics)
    for entry in reversed(list(history)):
        for name in wanted - latest.keys():
            value = objective_value(entry, name)
            if value is not None:
                latest[name] = value
        if len(latest) == len(wanted):
            break
    return latest


def record_latest(record: TrialRecord, metrics: Iterable[str]) -> dict[str, float]:
    """A persisted trial's latest values: from its history, and from ``latest_metrics``,
    which holds them whole when the history is downsampled."""
    wanted = list(metrics)
    latest = latest_values(record.history, wanted)
    latest.update({k: v for k, v in (record.latest_metrics or {}).items() if k in wanted})
    return latest


def config_key(params: Mapping[str, Any], names: Iterable[str]) -> tuple:
    """Equal for equal configurations; repr keeps 1 and 1.0 and True apart, as the space does."""
    return tuple((name, type(params.get(name)).__name__, repr(params.get(name))) for name in sorted(names))
