"""The one sanitiser for everything written to the API server (Trial and Experiment
status, conditions, Events, Trial bodies): valid JSON and bounded, whatever a trial
reports.  Pure; ``k8s.store`` applies it to every write.

The documented JSON form of numbers JSON cannot hold (README, "NaN and Infinity"):
NaN -> ``"NaN"``, +Infinity -> ``"Infinity"``, -Infinity -> ``"-Infinity"``, and an
integer outside int64 (only from old data: ingest refuses them) -> its decimal string.
``kubectl get -o yaml`` shows them as they are; ``decode_number`` reads them back.
"""
from __future__ import annotations

import json
import math
from typing import Any

from kubetune.spec.results import INT64_MAX, INT64_MIN

NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

MAX_MESSAGE_BYTES = 1024          # Experiment message, conditions, Events (issue 14)
MAX_STRING_CHARS = 16 * 1024      # any other string (a Trial's traceback is cut here first)
MAX_DEPTH = 8
ELLIPSIS = " ..."


def encode_number(value: float | int) -> float | int | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        return str(value)
    return value


def decode_number(value: Any) -> Any:
    """The inverse of ``encode_number`` for the non-finite strings; others unchanged."""
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    return value


def cap_text(text: str, max_bytes: int = MAX_MESSAGE_BYTES) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, head kept (an error's first line
    names it; kubetune formats tracebacks message-first)."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes - len(ELLIPSIS)].decode("utf-8", errors="ignore") + ELLIPSIS


def json_safe(value: Any, *, max_string: int = MAX_STRING_CHARS, depth: int = 0) -> Any:
    """``value`` as strict JSON data: non-finite numbers and huge integers in their
    documented string form, strings capped, unknown objects as their ``str``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return encode_number(value)
    if isinstance(value, str):
        return value if len(value) <= max_string else value[:max_string] + ELLIPSIS
    if depth >= MAX_DEPTH:
        return cap_text(str(value), 256)
    if isinstance(value, dict):
        return {cap_text(str(k), 256): json_safe(v, max_string=max_string, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, max_string=max_string, depth=depth + 1) for v in value]
    item = getattr(value, "item", None)     # numpy scalars
    if callable(item):
        try:
            return json_safe(item(), max_string=max_string, depth=depth)
        except (TypeError, ValueError):
            pass
    return cap_text(str(value), 256)


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), allow_nan=False).encode())


def fit(value: Any, max_bytes: int) -> Any:
    """``value`` (already ``json_safe``) shrunk until its JSON takes at most ``max_bytes``:
    the largest list loses its older half, or the largest string its tail, one step at a
    time.  The renderers keep objects well under their caps; this is the last guard, so
    no trial can make a write the API server refuses for its size."""
    while json_size(value) > max_bytes:
        path, _ = _largest(value, ())
        if path is None:     # nothing left to shrink
            return {} if isinstance(value, dict) else None
        value = _shrink(value, path)
    return value


def _largest(value: Any, path: tuple) -> tuple[tuple | None, int]:
    """The path of the biggest shrinkable list or string inside ``value`` (None: none)."""
    best: tuple[tuple | None, int] = (None, 0)
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
        if len(value) > 1:
            best = (path, json_size(value))
    else:
        if isinstance(value, str) and len(value) > 16:
            return path, len(value)
        return best
    for key, child in items:
        found = _largest(child, path + (key,))
        if found[1] > best[1]:
            best = found
    return best


def _shrink(value: Any, path: tuple) -> Any:
    if not path:
        if isinstance(value, list):
            return value[len(value) // 2:]
        return value[:len(value) // 2] + ELLIPSIS
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _shrink(value[head], rest)
    return copy
