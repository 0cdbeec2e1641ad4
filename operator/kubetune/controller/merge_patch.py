"""JSON merge patches (RFC 7386) that also remove: a key the new status no longer has
is sent as null, else the API server keeps the old value (a resumed Experiment would
keep its completionTime)."""
from __future__ import annotations

from typing import Any, Mapping


def merge_patch(previous: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The patch that turns ``previous`` into ``wanted`` (nested objects patched key by key)."""
    patch: dict[str, Any] = {}
    for key, value in wanted.items():
        before = previous.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    for key in previous:
        if key not in wanted and previous[key] is not None:
            patch[key] = None
    return patch


def apply_merge_patch(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """Apply ``patch`` to ``target`` in place as the API server does (null removes)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            apply_merge_patch(target[key], value)
        else:
            target[key] = value
