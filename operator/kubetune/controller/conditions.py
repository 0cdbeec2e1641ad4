"""Kubernetes-style conditions (type/status/reason/message/lastTransitionTime/
observedGeneration), computed purely so ``kubectl wait --for=condition=X`` works."""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterable

from kubetune.core.sanitize import cap_text


def rfc3339(timestamp: float) -> str:
    """Seconds since the epoch -> RFC 3339 with microseconds (Kubernetes date-time)."""
    moment = dt.datetime.fromtimestamp(timestamp, tz=dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def set_condition(conditions: Iterable[dict[str, Any]], type_: str, status: bool, reason: str,
                  message: str, *, now: float, generation: int | None) -> list[dict[str, Any]]:
    """Return ``conditions`` with ``type_`` set; lastTransitionTime only moves when the
    status flips, so re-asserting a condition is not a change."""
    wanted = "True" if status else "False"
    result = []
    found = False
    for condition in conditions:
        if condition.get("type") != type_:
            result.append(condition)
            continue
        found = True
        transition = condition.get("lastTransitionTime") if condition.get("status") == wanted else rfc3339(now)
        result.append(_condition(type_, wanted, reason, message, transition or rfc3339(now), generation))
    if not found:
        result.append(_condition(type_, wanted, reason, message, rfc3339(now), generation))
    return result


def _condition(type_: str, status: str, reason: str, message: str, transition: str,
               generation: int | None) -> dict[str, Any]:
    # at most 1 KiB of message, whatever it quotes (a trial's exception, an API error)
    condition = {"type": type_, "status": status, "reason": cap_text(reason, 256), "message": cap_text(message or ""),
                 "lastTransitionTime": transition}
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition
