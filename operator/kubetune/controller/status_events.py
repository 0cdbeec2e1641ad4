"""Events for transitions of an Experiment's status that no single decision carries:
trials starting to wait for room, Ray going away and coming back, suspension.

Pure: ``(previous status, new status) -> [(type, reason, message)]``.  Only edges
produce events (a queue that stays queued, a Ray that stays down, says nothing
more), and the previous status after an operator restart is the persisted one, so
a restart does not repeat them.  Launches, trial failures, early stops and the
Experiment's completion are posted by the controller where they are decided."""
from __future__ import annotations

from typing import Any, Mapping

MAX_MESSAGE = 1000


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == type_:
            return condition
    return None


def _is_true(status: Mapping[str, Any], type_: str) -> bool:
    condition = _condition(status, type_)
    return condition is not None and condition.get("status") == "True"


def status_events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    events: list[tuple[str, str, str]] = []
    queued_before, queued_now = previous.get("queueReason") or "", status.get("queueReason") or ""
    if queued_now and not queued_before:
        counts = status.get("trialCounts") or {}
        events.append(("Normal", "TrialsQueued",
                       f"{counts.get('queued', 0)} trial(s) waiting for room: {queued_now}"[:MAX_MESSAGE]))

    down_before, down_now = _is_true(previous, "RayUnavailable"), _is_true(status, "RayUnavailable")
    if down_now and not down_before:
        message = (_condition(status, "RayUnavailable") or {}).get("message") or "Ray cluster unreachable"
        events.append(("Warning", "RayUnavailable", message[:MAX_MESSAGE]))
    elif down_before and not down_now and _condition(status, "RayUnavailable") is not None:
        events.append(("Normal", "RayConnected", "the Ray cluster answers again; trials continue"))

    lost_before, lost_now = _is_true(previous, "ResultsStoreUnavailable"), _is_true(status, "ResultsStoreUnavailable")
    if lost_now and not lost_before:
        message = (_condition(status, "ResultsStoreUnavailable") or {}).get("message") or "results store unavailable"
        events.append(("Warning", "ResultsStoreUnavailable", message[:MAX_MESSAGE]))
    elif lost_before and not lost_now and _condition(status, "ResultsStoreUnavailable") is not None:
        message = (_condition(status, "ResultsStoreUnavailable") or {}).get("message") or "results are stored"
        events.append(("Normal", "ResultsStored", message[:MAX_MESSAGE]))

    if _is_true(status, "ResultsRejected"):
        now, before = _condition(status, "ResultsRejected") or {}, _condition(previous, "ResultsRejected") or {}
        if now.get("message") != before.get("message"):   # more rows set aside: say so again
            events.append(("Warning", "ResultsRejected", str(now.get("message") or "")[:MAX_MESSAGE]))

    phase_before, phase_now = previous.get("phase"), status.get("phase")
    if phase_now == "Suspended" and phase_before != "Suspended":
        events.append(("Normal", "Suspended", "spec.suspend is true: no new trials are launched"))
    elif phase_before == "Suspended" and phase_now == "Running":
        events.append(("Normal", "Resumed", "spec.suspend is false: trials are launched again"))
    return events
