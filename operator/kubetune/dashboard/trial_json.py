"""One trial's JSON as optuna-dashboard's study-detail view answers it, made faster.

Opening a study of 10,000 trials x 100 results turns a million intermediate values
into JSON.  optuna-dashboard's ``serialize_frozen_trial`` converts each with three
numpy calls, and the standard library's encoder formats a float in ~1 us here: ~1.4 s
of CPU for the million even with the values formatted by C loops, most of a cold
opening (BENCHMARKS.md, Dashboard).  So:

- everything but the parameters, the intermediate values (and finite values) is
  still made by optuna-dashboard's serializer (on a copy of the trial without them),
  so its format stays its own; the parameters are listed as it lists them, each
  distribution's JSON made once by its ``serialize_distribution`` (``TrialEncoder``);
- the intermediate values are put in as it puts them (by step; NaN and infinities as
  the strings "nan", "inf", "-inf"), the trial's values too when all are finite (as
  they are then: the serializer only changes infinities), and the whole dict is
  encoded by orjson (a fast encoder: ~50 ns a float).

orjson writes compact JSON and shortest floats its own way (``1e-5``, where Python
writes ``1e-05``): the text differs from ``json.dumps``'s, the parsed JSON does not
(tests/unit/test_dashboard_json.py compares the served body with optuna-dashboard's
own, parsed).  Where the two would differ in value, ``json.dumps`` writes as
optuna-dashboard does: a non-finite float elsewhere in the trial (a constraint whose
metric was never reported: ``json.dumps`` writes ``Infinity``, orjson ``null``), or
anything orjson refuses (an integer over 64 bits, a lone surrogate)."""
from __future__ import annotations

import json
import math
from typing import Any

import orjson
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial

from kubetune.dashboard import dashboard_compat as odc
from kubetune.dashboard.packed_trial import PackedCurveTrial, plain_copy


def trial_json(study_id: int, trial: FrozenTrial, system_attrs: dict[str, Any]) -> bytes:
    """What optuna-dashboard's view writes for ``trial``, parsed the same."""
    return TrialEncoder(study_id, system_attrs).encode(trial)


class TrialEncoder:
    """Encodes the trials of one study's body.  Every trial's parameters share a few
    distribution objects (the storage's), whose JSON optuna-dashboard's serializer makes
    again for each trial and parameter: two thirds of its time.  So the parameters are
    listed here, as it lists them, with each distribution's JSON made once (by its
    ``serialize_distribution``) and each value's type named once."""

    def __init__(self, study_id: int, system_attrs: dict[str, Any]) -> None:
        self.study_id = study_id
        self.system_attrs = system_attrs
        self._distributions: dict[int, tuple[BaseDistribution, dict]] = {}
        self._types: dict[type, str] = {}

    def encode(self, trial: FrozenTrial) -> bytes:
        bare = plain_copy(trial, intermediate_values={}, params={}, distributions={})
        values = trial.values
        finite = values is not None and all(map(math.isfinite, values))
        if finite:   # written as they are; the serializer's three numpy calls per value only matter otherwise
            bare.values = None
        serialized = odc.serialize_frozen_trial(self.study_id, bare, self.system_attrs)
        serialized["params"] = self._params(trial)
        packed = trial.points_json() if isinstance(trial, PackedCurveTrial) else None
        serialized["intermediate_values"] = orjson.Fragment(packed) if packed is not None else \
            intermediate_values(trial.intermediate_values)
        if finite:   # where the serializer puts them: before the times
            times = {key: serialized.pop(key) for key in ("datetime_start", "datetime_complete") if key in serialized}
            serialized["values"] = list(values)
            serialized.update(times)
        if all(map(math.isfinite, serialized.get("constraints") or ())):
            try:
                return orjson.dumps(serialized)
            except TypeError:   # orjson.JSONEncodeError: what only the standard encoder writes
                pass
        if packed is not None:
            serialized["intermediate_values"] = intermediate_values(trial.intermediate_values)
        return json.dumps(serialized).encode()

    def _params(self, trial: FrozenTrial) -> list[dict[str, Any]]:
        """``serialize_frozen_trial``'s list of parameters."""
        listed = []
        distributions = trial.distributions
        for name, value in trial.params.items():
            distribution = distributions.get(name)
            if distribution is None:
                continue
            listed.append({"name": name, "param_internal_value": distribution.to_internal_repr(value),
                           "param_external_value": str(value), "param_external_pytyp": self._type(value),
                           "distribution": self._distribution(distribution)})
        return listed

    def _distribution(self, distribution: BaseDistribution) -> dict:
        known = self._distributions.get(id(distribution))
        if known is None or known[0] is not distribution:   # kept with the object: its id is not reused meanwhile
            known = self._distributions[id(distribution)] = (distribution, odc.serialize_distribution(distribution))
        return known[1]

    def _type(self, value: Any) -> str:
        kind = type(value)
        named = self._types.get(kind)
        if named is None:
            named = self._types[kind] = str(kind)
        return named


def intermediate_values(values: dict[int, float]) -> list[dict[str, Any]]:
    """``[{"step": s, "value": v}]`` by step, non-finite values as strings, as
    ``serialize_frozen_trial`` makes them (without its three numpy calls per value)."""
    steps = list(values)
    if steps != sorted(steps):   # the storage hands them by step nearly always: checking is cheap
        values = dict(sorted(values.items()))
    numbers = list(values.values())
    if all(map(math.isfinite, numbers)):
        return [{"step": step, "value": value} for step, value in zip(values, numbers)]
    return [{"step": step, "value": _number(value)} for step, value in values.items()]


def _number(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value
