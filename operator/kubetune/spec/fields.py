"""Reading one field of an Experiment spec: its type and bounds, or a ``SpecError``
naming the field's path and what to write instead.  The readers every part of
spec/ parses with (parse.py, search_space.py, objectives.py)."""
from __future__ import annotations

import math
from typing import Any, Mapping

from kubetune.spec.model import SpecError
from kubetune.spec.quantities import parse_duration


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mapping(value: Any, path: str, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise SpecError(path, "required")
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, f"must be an object (got {type(value).__name__})")
    return value


def only_keys(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            raise SpecError(f"{path}.{key}", f"unknown field; expected one of: {', '.join(allowed)}")


def integer(obj: Mapping[str, Any], key: str, path: str, default: int | None, minimum: int | None,
         maximum: int | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(f"{path}.{key}", f"must be an integer (got {value!r})")
    if minimum is not None and value < minimum:
        raise SpecError(f"{path}.{key}", f"must be >= {minimum} (got {value})")
    if maximum is not None and value > maximum:
        raise SpecError(f"{path}.{key}", f"must be <= {maximum} (got {value})")
    return value


def number(obj: Mapping[str, Any], key: str, path: str, default: float | None, minimum: float | None = None) -> float | None:
    value = obj.get(key)
    if value is None:
        return default
    if not is_number(value):
        raise SpecError(f"{path}.{key}", f"must be a finite number (got {value!r})")
    if minimum is not None and value < minimum:
        raise SpecError(f"{path}.{key}", f"must be >= {minimum:g} (got {value})")
    return float(value)


def boolean(obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false (got {value!r})")
    return value


def string(obj: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str | None:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise SpecError(f"{path}.{key}", f"must be a non-empty string (got {value!r})")
    return value


def one_of(obj: Mapping[str, Any], key: str, path: str, options: tuple[str, ...], default: str, what: str) -> str:
    value = obj.get(key, default)
    if value not in options:
        raise SpecError(f"{path}.{key}", f"unknown {what} {value!r}; use one of: {', '.join(options)}")
    return value


def duration(obj: Mapping[str, Any], key: str, path: str) -> float | None:
    if obj.get(key) is None:
        return None
    try:
        return parse_duration(obj[key])
    except ValueError as exc:
        raise SpecError(f"{path}.{key}", str(exc)) from None


# ------------------------------------------------------------------ sections
