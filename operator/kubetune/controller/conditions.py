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


# kstatus (sigs.k8s.io/cli-utils pkg/kstatus), the convention Flux and kpt read:
# status.observedGeneration != metadata.generation -> InProgress; then Reconciling=True
# -> InProgress, Stalled=True -> Failed; then Ready: True -> Current, False -> InProgress.
# Ready is also what `kubectl wait --for=condition=Ready` waits on: True only once done.
KSTATUS_TYPES = ("Ready", "Reconciling", "Stalled")
FINAL_PHASES = ("Succeeded", "Failed")


def kstatus_conditions(conditions: Iterable[dict[str, Any]], phase: str, reason: str, message: str, *,
                       now: float, generation: int | None) -> list[dict[str, Any]]:
    """``conditions`` with Ready, Reconciling and Stalled set from ``phase`` alone:

    - Pending, Queued, Running: Reconciling (the operator is still at work);
    - Succeeded: Ready;
    - Failed: Stalled, with the failure's reason and message;
    - Suspended: none of them True; Ready=False says Suspended, which kstatus reads as
      InProgress: not done, not failed (a Flux Kustomization waiting on it keeps waiting).
    Every False one carries the phase's reason too, so each condition reads on its own."""
    reason = reason or phase
    wanted = {"Ready": phase == "Succeeded", "Stalled": phase == "Failed",
              "Reconciling": phase not in (*FINAL_PHASES, "Suspended")}
    result = list(conditions)
    for type_ in KSTATUS_TYPES:
        result = set_condition(result, type_, wanted[type_], reason, message, now=now, generation=generation)
    return result
