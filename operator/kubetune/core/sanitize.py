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


MIN_CUT_CHARS = 64   # a shorter string is never cut: a date-time or a phase cut short is a write refused


def fit(value: Any, max_bytes: int, keep: tuple[str, ...] = ()) -> Any:
    """``value`` (already ``json_safe``) shrunk until its JSON takes at most ``max_bytes``:
    the largest list loses its older half, the largest map of plain values (parameters,
    metrics: whatever its keys) its later half, or the largest string its tail, one step
    at a time; when none is left, the biggest entry goes.  The renderers keep objects
    well under their caps; this is the last guard, so no trial can make a write the API
    server refuses for its size.

    ``keep``: top-level keys never cut nor dropped (phase, startTime, counts: what a
    restarted operator reads the outcome from); the rest fits into what they leave."""
    if keep and isinstance(value, dict):
        kept = {key: value[key] for key in keep if key in value}
        rest = fit({key: v for key, v in value.items() if key not in kept}, max(max_bytes - json_size(kept), 2))
        return {key: kept[key] if key in kept else rest[key] for key in value if key in kept or key in rest}
    while json_size(value) > max_bytes:
        path, _ = _largest(value, ())
        if path is not None:
            value = _shrink(value, path)
        elif isinstance(value, (dict, list)) and value:   # only short strings and structure left
            value = _without_biggest(value)
        else:
            return {} if isinstance(value, dict) else None
    return value


def _without_biggest(value: dict | list) -> dict | list:
    if isinstance(value, list):
        return value[1:]
    biggest = max(value, key=lambda key: json_size(value[key]) + len(key))
    return {key: v for key, v in value.items() if key != biggest}


def _plain_map(value: Any) -> bool:
    return isinstance(value, dict) and len(value) > 1 and not any(isinstance(v, (dict, list)) for v in value.values())


def _largest(value: Any, path: tuple) -> tuple[tuple | None, int]:
    """The path of the biggest shrinkable list, plain map or string inside ``value``
    (None: none).  A child that is more than half of a shrinkable parent is preferred
    (one huge string is cut rather than its neighbours dropped)."""
    best: tuple[tuple | None, int] = (None, 0)
    if isinstance(value, dict):
        items = value.items()
        if _plain_map(value):
            best = (path, json_size(value))
    elif isinstance(value, list):
        items = enumerate(value)
        if len(value) > 1:
            best = (path, json_size(value))
    else:
        if isinstance(value, str) and len(value) > MIN_CUT_CHARS:
            return path, len(value)
        return best
    own = best[1]   # 0: this node itself is not shrinkable
    child: tuple[tuple | None, int] = (None, 0)
    for key, item in items:
        found = _largest(item, path + (key,))
        if found[1] > child[1]:
            child = found
    if child[0] is not None and (not own or 2 * child[1] > own):
        return child
    return best


def _shrink(value: Any, path: tuple) -> Any:
    if not path:
        if isinstance(value, list):
            return value[len(value) // 2:]
        if isinstance(value, dict):
            return dict(list(value.items())[:len(value) // 2])
        return value[:len(value) // 2] + ELLIPSIS
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _shrink(value[head], rest)
    return copy
