"""An Experiment's stored rows as Optuna's frozen study and trials (pure: no I/O).

What a study needs beyond the store's first metric — every objective with its
direction, the constraints, the parameters' distributions — is the ``study`` JSON the
operator and ``kubetune run`` write on the Experiment's row (results/study_meta.py).  A row an
older kubetune wrote has none: then the one objective is ``metric``/``mode`` and the
distributions are inferred from the values the trials had.

Trial states follow the operator's rule for what Optuna is told (core/search.py):
Succeeded with every objective's last value finite is COMPLETE, otherwise PRUNED (as
is Stopped: early stopping); Failed is FAIL; Pending/Queued are WAITING; Running and
Paused (checkpointed, will resume) are RUNNING."""
from __future__ import annotations

import datetime
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution,
                                  json_to_distribution)
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from kubetune.core.optuna_compat import CONSTRAINTS_KEY, contains   # CONSTRAINTS_KEY: where samplers read them
from kubetune.dashboard.packed_trial import PackedCurveTrial, Points
from kubetune.results.rows import ExperimentRow, TrialRow
from kubetune.spec.model import Constraint

METRIC_NAMES_KEY = "study:metric_names"    # what Study.set_metric_names writes; the dashboard shows it

STATES = {"Succeeded": TrialState.COMPLETE, "Failed": TrialState.FAIL, "Stopped": TrialState.PRUNED,
          "Running": TrialState.RUNNING, "Paused": TrialState.RUNNING,
          "Pending": TrialState.WAITING, "Queued": TrialState.WAITING}


@dataclass(frozen=True)
class StudyShape:
    objectives: tuple[tuple[str, str], ...]          # (metric, "min" | "max"), the first leads
    constraints: tuple[Constraint, ...] = ()
    distributions: Mapping[str, BaseDistribution] = field(default_factory=dict)   # as declared

    @property
    def directions(self) -> list[StudyDirection]:
        return [StudyDirection.MAXIMIZE if mode == "max" else StudyDirection.MINIMIZE for _, mode in self.objectives]

    @property
    def metrics(self) -> list[str]:
        """Every metric a trial's outcome depends on: objectives, then constraint metrics."""
        return list(dict.fromkeys([m for m, _ in self.objectives] + [c.metric for c in self.constraints]))


def shape_of(row: ExperimentRow) -> StudyShape:
    """The row's study JSON, or what an older row has (its one metric); a part that does
    not parse is left out rather than failing the whole view."""
    fallback = ((row.metric, row.mode or "min"),) if row.metric else (("objective", "min"),)
    try:
        data = json.loads(row.study) if row.study else {}
    except ValueError:
        data = {}
    objectives = tuple((str(o["metric"]), "max" if o.get("mode") == "max" else "min")
                       for o in data.get("objectives") or [] if isinstance(o, dict) and o.get("metric"))
    constraints = tuple(Constraint(metric=str(c["metric"]), min=c.get("min"), max=c.get("max"))
                        for c in data.get("constraints") or [] if isinstance(c, dict) and c.get("metric"))
    distributions = {}
    for name, text in (data.get("distributions") or {}).items():
        try:
            distributions[name] = json_to_distribution(text)
        except Exception:  # noqa: BLE001 - a distribution this Optuna cannot read: inferred instead
            continue
    return StudyShape(objectives or fallback, constraints, distributions)


# ---------------------------------------------------------------------- parameters


def _choice(value: Any) -> Any:
    """A value Optuna's CategoricalDistribution can hold (lists, dicts: their JSON)."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value, default=str)


def distributions_for(declared: Mapping[str, BaseDistribution],
                      params: Sequence[Mapping[str, Any]]) -> dict[str, BaseDistribution]:
    """One distribution per parameter name over every trial: the declared one when it
    holds every value seen (warm-started or edited Experiments may hold others), else
    one inferred from the values (numbers: their range; anything else: the choices)."""
    seen: dict[str, list[Any]] = {}
    for trial_params in params:
        for name, value in trial_params.items():
            seen.setdefault(name, []).append(value)
    found: dict[str, BaseDistribution] = {}
    for name, values in seen.items():
        if name in declared and all(contains(declared[name], v) for v in values):
            found[name] = declared[name]
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            found[name] = IntDistribution(min(values), max(values))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            found[name] = FloatDistribution(float(min(values)), float(max(values)))
        else:
            found[name] = CategoricalDistribution(list(dict.fromkeys(_choice(v) for v in values)))
    return found


def trial_params(params: Mapping[str, Any], distributions: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    return {name: value if not isinstance(distributions[name], CategoricalDistribution) else _choice(value)
            for name, value in params.items()}


# ---------------------------------------------------------------------- trials


@dataclass
class Curve:
    """What the store's results say of one trial: the first objective per iteration
    (Optuna keeps the first value reported at a step) and the last value of each metric."""
    intermediate: dict[int, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None
    points: Points | None = None     # the intermediate values still packed (then ``intermediate`` is unused)


def _time(epoch: float | None) -> datetime.datetime | None:
    return datetime.datetime.fromtimestamp(epoch) if epoch else None


def frozen_trial(number: int, trial_id: int, row: TrialRow, shape: StudyShape, curve: Curve,
                 distributions: Mapping[str, BaseDistribution]) -> FrozenTrial:
    state = STATES.get(row.phase, TrialState.WAITING)
    finals = [curve.last.get(metric) for metric, _ in shape.objectives]
    values = None
    if state == TrialState.COMPLETE:
        if all(v is not None and math.isfinite(v) for v in finals):
            values = finals
        else:
            state = TrialState.PRUNED
    if state == TrialState.PRUNED and len(shape.objectives) == 1 and (curve.points or curve.intermediate):
        # Optuna's own rule: a pruned trial's value is its last finite intermediate value
        last = curve.points.last() if curve.points else curve.intermediate[max(curve.intermediate)]
        values = [last] if math.isfinite(last) else None
    system_attrs: dict[str, Any] = {}
    if state.is_finished() and shape.constraints:
        system_attrs[CONSTRAINTS_KEY] = [c.violation(curve.last.get(c.metric)) for c in shape.constraints]
    user_attrs = {"trial": row.name, "phase": row.phase}
    if row.reason:
        user_attrs["reason"] = row.reason
    if row.attempt:
        user_attrs["attempt"] = row.attempt
    if curve.points is not None:
        kind, intermediate = functools.partial(PackedCurveTrial, points=curve.points), {}
    else:
        kind, intermediate = FrozenTrial, {"intermediate_values": dict(curve.intermediate)}
    return kind(
        number=number, state=state, value=None, values=values,
        datetime_start=_time(curve.started) if state != TrialState.WAITING else None,
        datetime_complete=_time(curve.ended) if state.is_finished() else None,
        params=trial_params(row.params, distributions),
        distributions={name: distributions[name] for name in row.params},
        user_attrs=user_attrs, system_attrs=system_attrs, trial_id=trial_id, **intermediate)
