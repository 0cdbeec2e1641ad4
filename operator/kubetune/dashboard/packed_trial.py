"""A trial whose intermediate values stay as the store packed them until asked for.

A cold opening of 10,000 trials x 100 results turned the compact rows' packed curves
(results/curves.py) into a million dict entries, only for the study-detail response to
turn each back into ``{"step": s, "value": v}`` dicts for its encoder: ~0.6-0.8 s of
CPU of a ~2 s opening, all of it per-value Python work.  Here the curve stays as the row
holds it (``Points``), and:

- the response splices in the JSON of the trial's intermediate values the writer
  stored with the row (``Points.json``; made here from the packed values when the row
  has none: a database an older kubetune wrote, non-finite values);
- ``PackedCurveTrial.intermediate_values`` makes the dict on first use, for whatever
  else asks (optuna-dashboard's other views, a plot, ``get_trial``): the same values.

A copy, pickle, comparison or repr of a ``PackedCurveTrial`` sees a plain
``FrozenTrial``'s attributes (the dict made), so nothing else can tell the difference."""
from __future__ import annotations

import math
from typing import Any

import orjson
from optuna.trial import FrozenTrial

from kubetune.results.curves import unpack

_POINTS = "_kubetune_points"   # where a PackedCurveTrial keeps its Points (left out of its state)


class Points:
    """A curve as the store packs it: int64 steps and float64 values, in the order first reported."""

    __slots__ = ("steps", "values", "encoded")

    def __init__(self, steps: bytes, values: bytes, encoded: bytes | None = None) -> None:
        self.steps, self.values = steps, values
        self.encoded = encoded     # their ``json()`` as the writer stored it (results/curves.encode_points)

    def __bool__(self) -> bool:
        return bool(self.steps)

    def lists(self) -> tuple[list[int], list[float]]:
        return unpack("q", self.steps), unpack("d", self.values)

    def as_dict(self) -> dict[int, float]:
        return dict(zip(*self.lists()))

    def last(self) -> float:
        """The value at the highest step (Optuna's value of a pruned trial)."""
        steps, values = self.lists()
        return values[steps.index(max(steps))]

    def json(self) -> bytes | None:
        """optuna-dashboard's ``[{"step": s, "value": v}, ...]`` by step, or None when that
        takes more than the fast path (a value not finite: written as a string there; steps
        not in order; one step reported twice cannot happen: the row keeps the first)."""
        if self.encoded is not None:
            return self.encoded
        steps, values = self.lists()
        if not all(map(math.isfinite, values)) or steps != sorted(steps):
            return None
        return orjson.dumps([{"step": step, "value": value} for step, value in zip(steps, values)])


class PackedCurveTrial(FrozenTrial):
    """A FrozenTrial made with ``points`` in place of its intermediate values."""

    def __init__(self, *, points: Points, **kwargs: Any) -> None:
        self.__dict__[_POINTS] = points
        super().__init__(intermediate_values=None, **kwargs)

    @property
    def intermediate_values(self) -> dict[int, float]:
        made = self.__dict__.get("intermediate_values")
        if made is None:
            made = self.__dict__["intermediate_values"] = self.__dict__[_POINTS].as_dict()
        return made

    @intermediate_values.setter
    def intermediate_values(self, values: dict[int, float] | None) -> None:
        self.__dict__["intermediate_values"] = values

    def points_json(self) -> bytes | None:
        """``Points.json`` while the intermediate values were not made (or set) here."""
        if self.__dict__.get("intermediate_values") is not None:
            return None
        return self.__dict__[_POINTS].json()

    def has_intermediate_values(self) -> bool:
        made = self.__dict__.get("intermediate_values")
        return bool(made) if made is not None else bool(self.__dict__[_POINTS])

    def __getstate__(self) -> dict[str, Any]:
        return plain_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, FrozenTrial):
            return NotImplemented
        return plain_state(self) == plain_state(other)

    __hash__ = FrozenTrial.__hash__

    def __repr__(self) -> str:
        return repr(plain_copy(self)).replace("FrozenTrial(", f"{type(self).__name__}(", 1)


def plain_state(trial: FrozenTrial) -> dict[str, Any]:
    """A trial's attributes as a plain FrozenTrial holds them."""
    state = {key: value for key, value in trial.__dict__.items() if key != _POINTS}
    if state.get("intermediate_values") is None:   # made for the copy: the trial stays packed
        state["intermediate_values"] = trial.__dict__[_POINTS].as_dict() if _POINTS in trial.__dict__ else \
            trial.intermediate_values
    return state


def plain_copy(trial: FrozenTrial, **replaced: Any) -> FrozenTrial:
    """A shallow copy as a plain FrozenTrial, with ``replaced`` attributes set (given
    intermediate values, a PackedCurveTrial's are not made)."""
    copied = FrozenTrial.__new__(FrozenTrial)
    if "intermediate_values" in replaced:
        copied.__dict__.update((key, value) for key, value in trial.__dict__.items() if key != _POINTS)
    else:
        copied.__dict__.update(plain_state(trial))
    for name, value in replaced.items():
        setattr(copied, name, value)
    return copied


def has_intermediate_values(trial: FrozenTrial) -> bool:
    if isinstance(trial, PackedCurveTrial):
        return trial.has_intermediate_values()
    return bool(trial.intermediate_values)
