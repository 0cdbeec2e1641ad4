"""``spec.searchSpace``: each parameter's distribution and its bounds, and the size
limit of the whole (what the chart's admission policy also counts)."""
from __future__ import annotations

from typing import Any, Mapping

from kubetune.spec.fields import is_number, mapping
from kubetune.spec.model import DISTRIBUTIONS, PARAM_NAME, Param, SpecError, param_env_name

MAX_CHOICE_TEXT = 256               # characters of one string choice (the CRD's maxLength)
MAX_CHOICES = 256                   # values of one choice (the CRD's maxItems)
# randint/quniform bounds and step counts: integers a float still holds exactly, so a
# range is computed on, never listed (Param.contains, grid_value), whatever its size
MAX_RANGE = 2 ** 53
# The CRD bounds each part of a search space (64 names, 256 choices each) but cannot see
# the total: choice values are untyped, and CRD rules do not reach them. A search space
# is refused above this size (search_space_size): at apply by the chart's
# ValidatingAdmissionPolicy (templates/search-space-size-policy.yaml, the same sum and
# limit), here for clusters without it and for `kubetune run`.
MAX_SEARCH_SPACE_SIZE = 128 * 1024


def _bounds(values: Any, path: str, kind: str, count: int, shape: str) -> list[Any]:
    if not isinstance(values, list) or len(values) != count:
        got = f"{len(values)} values" if isinstance(values, list) else repr(values)
        raise SpecError(path, f"expected {shape} (got {got})")
    for value in values:
        if not is_number(value):
            raise SpecError(path, f"bounds must be finite numbers (got {value!r})")
    if values[0] >= values[1]:
        raise SpecError(path, f"low must be < high (got low={values[0]}, high={values[1]})")
    return values


def _param(name: str, raw: Any) -> Param:
    path = f"spec.searchSpace.{name}"
    entry = mapping(raw, path, required=True)
    kinds = [k for k in entry if k in DISTRIBUTIONS]
    unknown = [k for k in entry if k not in DISTRIBUTIONS]
    if unknown:
        raise SpecError(f"{path}.{unknown[0]}",
                        f"unknown distribution; use exactly one of: {', '.join(DISTRIBUTIONS)}")
    if len(kinds) != 1:
        got = ", ".join(kinds) if kinds else "none"
        raise SpecError(path, f"needs exactly one of {', '.join(DISTRIBUTIONS)} (got {got})")
    kind = kinds[0]
    values = entry[kind]
    path = f"{path}.{kind}"
    if kind == "uniform":
        low, high = _bounds(values, path, kind, 2, "[low, high]")
        return Param(kind, low=float(low), high=float(high))
    if kind == "loguniform":
        low, high = _bounds(values, path, kind, 2, "[low, high]")
        if low <= 0:
            raise SpecError(path, f"low must be > 0 for a log scale (got {low})")
        return Param(kind, low=float(low), high=float(high))
    if kind == "quniform":
        if isinstance(values, list) and len(values) == 3 and is_number(values[2]) and values[2] <= 0:
            raise SpecError(path, f"q (the step) must be > 0 (got {values[2]})")
        low, high, q = _bounds(values, path, kind, 3, "[low, high, q]")
        _within_range(path, low, high)
        if q > high - low:
            raise SpecError(path, f"q (the step) must be <= high - low (got q={q}, high - low={high - low})")
        if (high - low) / q > MAX_RANGE:
            raise SpecError(path, f"has {(high - low) / q:.3g} steps of q (at most 2^53); use a larger q or uniform")
        if all(isinstance(v, int) for v in (low, high, q)):
            return Param(kind, low=low, high=high, q=q)
        return Param(kind, low=float(low), high=float(high), q=float(q))
    if kind == "randint":
        low, high = _bounds(values, path, kind, 2, "[low, high) with high exclusive")
        if not all(isinstance(v, int) or float(v).is_integer() for v in (low, high)):
            raise SpecError(path, f"bounds must be integers (got {values})")
        _within_range(path, low, high)
        return Param(kind, low=int(low), high=int(high))
    if kind == "ordinal":
        return _ordinal(path, values)
    # choice
    if not isinstance(values, list) or not values:
        raise SpecError(path, "expected a non-empty list of values, e.g. [32, 64, 128]")
    if len(values) > MAX_CHOICES:
        raise SpecError(path, f"has {len(values)} values (at most {MAX_CHOICES}); sample from a range "
                              "(randint, quniform, uniform) instead")
    seen: list[Any] = []
    for value in values:
        if not (isinstance(value, (str, bool)) or is_number(value)):
            raise SpecError(path, f"values must be numbers, strings or booleans (got {value!r})")
        if isinstance(value, str) and len(value) > MAX_CHOICE_TEXT:
            raise SpecError(path, f"a string value has {len(value)} characters (at most {MAX_CHOICE_TEXT})")
        # 1 == True in Python; compare with the type so [1, true] is not a duplicate.
        if any(type(v) is type(value) and v == value for v in seen):
            raise SpecError(path, f"duplicate value {value!r}")
        seen.append(value)
    return Param(kind, choices=tuple(values))


def _ordinal(path: str, values: Any) -> Param:
    """Increasing numbers, sampled in their order (unlike a choice's, which samplers
    treat as unordered: CMA-ES and GP do not search those at all)."""
    if not isinstance(values, list) or len(values) < 2:
        raise SpecError(path, "expected a list of at least 2 increasing numbers, e.g. [16, 32, 64, 128]")
    if len(values) > MAX_CHOICES:
        raise SpecError(path, f"has {len(values)} values (at most {MAX_CHOICES}); sample from a range "
                              "(quniform, loguniform, uniform) instead")
    for value in values:
        if not is_number(value):
            raise SpecError(path, f"values must be finite numbers (got {value!r}); for unordered values use choice")
    for before, after in zip(values, values[1:]):
        if not before < after:
            raise SpecError(path, f"values must increase (got {before!r} then {after!r}): list them in order, "
                                  "once each")
    _within_range(path, values[0], values[-1])
    return Param("ordinal", low=values[0], high=values[-1], choices=tuple(values))


def _within_range(path: str, low: float, high: float) -> None:
    if not -MAX_RANGE <= low < high <= MAX_RANGE:
        raise SpecError(path, f"bounds must be within [-2^53, 2^53] (got [{low:g}, {high:g}])")


def search_space_size(space: Mapping[str, Any]) -> int:
    """What the size limit counts: per parameter its name's length + 32, the length of
    each choice string (8 per number or boolean) and 8 per ordinal value. Not the JSON
    length: the admission policy computes this same sum in CEL, which has no JSON encoder."""
    total = 0
    for name, entry in space.items():
        total += len(str(name)) + 32
        choices = entry.get("choice") if isinstance(entry, Mapping) else None
        if isinstance(choices, list):
            total += sum(len(value) if isinstance(value, str) else 8 for value in choices)
        ordinal = entry.get("ordinal") if isinstance(entry, Mapping) else None
        if isinstance(ordinal, list):
            total += 8 * len(ordinal)
    return total


def search_space(raw: Any) -> dict[str, Param]:
    path = "spec.searchSpace"
    space = mapping(raw, path)
    if not space:
        raise SpecError(path, "required: at least one parameter, e.g. lr: {loguniform: [1.0e-5, 1.0e-1]}")
    _parameter_names(list(space))
    size = search_space_size(space)
    if size > MAX_SEARCH_SPACE_SIZE:
        raise SpecError(path, f"is too large: {size // 1024} KiB (at most {MAX_SEARCH_SPACE_SIZE // 1024} KiB, "
                              "counting each parameter name and choice string); sample from ranges "
                              "(uniform, randint, quniform) instead of listing values")
    return {str(name): _param(str(name), entry) for name, entry in space.items()}


YAML11_BOOLEAN_KEY = ("kubectl reads YAML 1.1, where an unquoted key y, n, yes, no, on or off is a boolean; "
                      "quote the key, e.g. \"y\": {uniform: [-5, 5]}")


def _parameter_names(names: list[Any]) -> None:
    """The CRD's rules on ``searchSpace`` keys, for files run without a CRD."""
    path = "spec.searchSpace"
    seen: dict[str, str] = {}
    for name in names:
        # PyYAML turns yes/no/on/off (not y/n) into booleans; kubectl sends them as "true"/"false"
        if isinstance(name, bool) or name in ("true", "false"):
            raise SpecError(path, f"has a parameter named {str(name).lower()}: {YAML11_BOOLEAN_KEY}")
        name = str(name)
        if not name:
            raise SpecError(path, "has an empty parameter name")
        if not PARAM_NAME.match(name):
            raise SpecError(f"{path}.{name}", "a parameter name has at most 128 characters, letters, digits and "
                                              "_ . - / : (each name is also an environment variable of pod trials)")
        env = param_env_name(name)
        if env in seen:
            raise SpecError(path, f"has parameter names that are one environment variable of a pod trial, {env}: "
                                  f"{seen[env]} and {name}; rename one of them (each name is upper-cased, "
                                  "with . - / : as _)")
        seen[env] = name
