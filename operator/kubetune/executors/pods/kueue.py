"""What Kueue says of one trial pod, as the trial's state: pure, from the pod and its Workload
(the admission window these states feed is the core's: core/admission.py).

Kueue's Pod integration gates a pod that names a LocalQueue (``kueue.x-k8s.io/queue-name``)
with the scheduling gate ``kueue.x-k8s.io/admission`` and creates a Workload for it:

- gated, the Workload without quota: ``Queued``, "waiting for Kueue admission in queue X";
- gated, quota reserved but an admission check pending (a ProvisioningRequest waiting for
  the cluster autoscaler, ...): ``Provisioning``, with the checks' messages;
- the gate removed: admitted; the queue wait is the pod's time from creation to being
  scheduled (Kueue removes the gate as it admits the workload);
- evicted (preempted, ...): Kueue marks the pod ``TerminationTarget`` and deletes it, and
  says why in a ``Stopped`` event on the pod, which outlives the pod.

None of these is a failure: a preempted trial is paused and resumes from its checkpoint.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kubetune.core.admission import EVICTED, PREEMPTED, PROVISIONING, QUEUED
from kubetune.executors.pods.times import epoch_of

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
TERMINATION_TARGET = "TerminationTarget"     # the pod condition Kueue sets before it deletes the pod
STOPPED_EVENT = "Stopped"                    # the event reason Kueue records on a pod it stops


@dataclass(frozen=True)
class Admission:
    """``waiting`` (a reason: QUEUED or PROVISIONING) while Kueue has not admitted the pod;
    ``evicted`` (PREEMPTED or EVICTED) once Kueue stops it; ``queue_wait_s`` once admitted.
    ``queue_full``: Kueue tried the Workload and could not reserve quota for it (its
    ``QuotaReserved`` condition is False), the signal that opens the window (``may_hand_over``)."""
    waiting: str = ""
    message: str = ""
    evicted: str = ""
    queue_wait_s: float | None = None
    queue_full: bool = False


def managed(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue admits this pod (it names a queue, or Kueue gated it: a namespace default)."""
    return bool(_labels(pod).get(QUEUE_LABEL)) or gated(pod)


def gated(pod: Mapping[str, Any]) -> bool:
    return any(gate.get("name") == ADMISSION_GATE for gate in (pod.get("spec") or {}).get("schedulingGates") or [])


def admission(pod: Mapping[str, Any], workload: Mapping[str, Any] | None,
              local_queue: Mapping[str, Any] | None = None) -> Admission:
    """The state of a pod Kueue manages (``managed(pod)``); ``local_queue``, its LocalQueue,
    gives the number of workloads pending there (Kueue's visibility API, which would give
    the position, is an aggregated API server not every cluster runs)."""
    stopped = _condition(pod.get("status") or {}, TERMINATION_TARGET)
    if stopped is not None and stopped.get("status") == "True":
        return dataclasses.replace(eviction(stopped.get("message") or stopped.get("reason") or ""),
                                   queue_wait_s=queue_wait(pod))
    queue = _labels(pod).get(QUEUE_LABEL) or "the namespace's default queue"
    if gated(pod):
        status = (workload or {}).get("status") or {}
        reserved = _condition(status, "QuotaReserved")
        if reserved is not None and reserved.get("status") == "True":
            pending = [check for check in status.get("admissionChecks") or [] if check.get("state") != "Ready"]
            detail = "; ".join(f"{check.get('name')}: {check.get('message') or check.get('state')}"
                               for check in pending)
            return Admission(waiting=PROVISIONING, message=f"quota reserved in queue {queue}; waiting for admission "
                                                           f"checks{': ' + detail if detail else ''}")
        message = f"waiting for Kueue admission in queue {queue}"
        pending = ((local_queue or {}).get("status") or {}).get("pendingWorkloads")
        if pending:
            message += f" ({pending} workloads pending there)"
        why = (reserved or {}).get("message")
        return Admission(waiting=QUEUED, message=f"{message}: {why}" if why else message,
                         queue_full=reserved is not None and reserved.get("status") == "False")
    return Admission(queue_wait_s=queue_wait(pod))


def eviction(message: str) -> Admission:
    """Kueue stopped the pod; ``message`` is its word on why (the pod's condition or event)."""
    return Admission(evicted=PREEMPTED if "preempt" in message.lower() else EVICTED,
                     message=message or "evicted by Kueue")


def shown_waiting(reason: str, message: str, evictions: int, since_eviction: bool) -> tuple[str, str]:
    """The reason and message a waiting trial shows: a trial queued again after Kueue
    evicted it says Preempted (a pause: it resumes from its checkpoint once admitted)."""
    if reason == QUEUED and since_eviction:
        times = "once" if evictions == 1 else f"{evictions} times"
        return PREEMPTED, f"preempted {times}, resumes from its checkpoint; {message}"
    return reason, message


def stop_message(events: Iterable[Mapping[str, Any]], pod_name: str) -> str | None:
    """The latest ``Stopped`` event Kueue recorded on ``pod_name``; None if it stopped none."""
    latest: tuple[str, str] | None = None
    for event in events:
        if event.get("reason") != STOPPED_EVENT or (event.get("involvedObject") or {}).get("name") != pod_name:
            continue
        when = event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
            "creationTimestamp") or ""
        if latest is None or when >= latest[0]:
            latest = (when, event.get("message") or "")
    return latest[1] if latest is not None else None


def queue_wait(pod: Mapping[str, Any]) -> float | None:
    """Seconds from the pod's creation to its being scheduled (after admission); None before."""
    scheduled = _condition(pod.get("status") or {}, "PodScheduled")
    if scheduled is None or scheduled.get("status") != "True":
        return None
    created = epoch_of((pod.get("metadata") or {}).get("creationTimestamp"))
    at = epoch_of(scheduled.get("lastTransitionTime"))
    if created is None or at is None:
        return None
    return max(0.0, at - created)


def workload_owner(workload: Mapping[str, Any]) -> str | None:
    """The UID of the pod a Workload stands for."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            return ref.get("uid")
    return None


def _labels(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), None)
