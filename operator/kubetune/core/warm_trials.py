"""Trials of earlier Experiments that seed a search (spec.warmStart): which succeeded,
and which of them today's search space can use (and why not the others).  Pure."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from optuna.distributions import BaseDistribution

from kubetune.core import optuna_compat
from kubetune.core.samplers import contains
from kubetune.core.search_values import objective_value
from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.spec.model import ExperimentSpec


@dataclass(frozen=True)
class WarmTrial:
    """A completed trial of an earlier Experiment: ``source`` is ``<experiment>/<trial>``."""
    source: str
    params: Mapping[str, Any]
    metrics: Mapping[str, Any]


def warm_trials(experiment: str, records: Iterable[TrialRecord]) -> list[WarmTrial]:
    """The trials of an earlier Experiment that can seed a search: those that succeeded,
    with the latest value of every metric they reported."""
    found = []
    for record in sorted(records, key=lambda r: r.index):
        if record.phase is not TrialPhase.SUCCEEDED:
            continue
        metrics: dict[str, Any] = {}
        for entry in record.history:
            metrics.update({k: v for k, v in entry.items() if k != "iteration" and objective_value(entry, k) is not None})
        metrics.update(record.latest_metrics or {})
        found.append(WarmTrial(f"{experiment}/{record.name}", dict(record.params), metrics))
    return found


def _inside(spec: ExperimentSpec, name: str, distribution: BaseDistribution, value: Any) -> bool:
    param = spec.search_space.get(name)
    return optuna_compat.contains(distribution, value) if param is None else contains(param, distribution, value)


def _as_listed(spec: ExperimentSpec, name: str, value: Any) -> Any:
    """An ordinal's value as its list holds it (an earlier trial's 32.0 is the listed 32): the
    search then knows the configuration as evaluated, where config_key tells 32 from 32.0."""
    param = spec.search_space.get(name)
    if param is not None and param.kind == "ordinal":
        return param.choices[param.choices.index(value)]
    return value


def usable_warm_trials(spec: ExperimentSpec, distributions: Mapping[str, BaseDistribution],
                       warm_start: Sequence[WarmTrial]) -> tuple[list[WarmTrial], list[str]]:
    """The warm-start trials this search space can use (their values for today's
    parameters, extra parameters dropped), and why the others cannot be used."""
    usable: list[WarmTrial] = []
    problems: list[str] = []
    for warm in warm_start:
        missing = [name for name in distributions if name not in warm.params]
        outside = [name for name, dist in distributions.items()
                   if name in warm.params and not _inside(spec, name, dist, warm.params[name])]
        unreported = [o.metric for o in spec.objectives
                      if objective_value(warm.metrics, o.metric) is None
                      or math.isnan(objective_value(warm.metrics, o.metric))]
        if missing:
            problems.append(f"{warm.source}: has no value for {', '.join(missing)}")
        elif outside:
            problems.append(f"{warm.source}: {', '.join(f'{n}={warm.params[n]!r}' for n in outside)} "
                            f"outside this search space")
        elif unreported:
            problems.append(f"{warm.source}: reported no {', '.join(unreported)}")
        else:
            if spec.warm_start is not None and len(usable) >= spec.warm_start.max_trials:
                problems.append(f"{warm.source} and later: beyond warmStart.maxTrials "
                                f"({spec.warm_start.max_trials})")
                break
            usable.append(WarmTrial(warm.source, {n: _as_listed(spec, n, warm.params[n]) for n in distributions},
                                    {k: v for k, v in warm.metrics.items() if objective_value(warm.metrics, k)
                                     is not None}))
    return usable, problems
