"""An Experiment's pods as the pod executor last read them, with what they wait for.

One list call per Experiment at most every ``list_interval_s`` (every poll of every trial
reads from it), and, only for what the pods show, the cluster autoscaler's latest events
on the pending ones, and Kueue's Workloads and LocalQueues of the gated ones (kueue.py
parses them).  A failed read keeps the last listing: results still flow.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubetune.executors.pods import kueue
from kubetune.executors.pods import spec as pod_spec
from kubetune.k8s.kueue import KueueApi
from kubetune.k8s.pods import PodApi
from kubetune.spec.trial_key import TrialKey

log = logging.getLogger(__name__)

# a Kueue whose Workloads lack the job-uid label: their whole namespace, this seldom
KUEUE_FULL_LIST_INTERVAL_S = 30.0


@dataclass
class Listing:
    at: float = float("-inf")            # monotonic time the list call was sent
    pods: dict[str, dict] = field(default_factory=dict)   # pod name -> pod
    autoscaler: dict[str, str] = field(default_factory=dict)   # pod name -> latest autoscaler event
    workloads: dict[str, dict] = field(default_factory=dict)   # pod UID -> its Kueue Workload (gated pods only)
    local_queues: dict[str, dict] = field(default_factory=dict)   # LocalQueue name -> it (gated pods' only)


class PodListings:
    """The latest ``Listing`` of each Experiment's pods.  Thread-safe."""

    def __init__(self, api: PodApi, kueue_api: KueueApi, list_interval_s: float) -> None:
        self.api = api
        self.kueue = kueue_api
        self.list_interval_s = list_interval_s
        self._lock = threading.RLock()
        self._listings: dict[tuple[str, str], Listing] = {}
        self._full_workload_lists: dict[str, float] = {}   # namespace -> when all its Workloads were last listed

    def listing(self, namespace: str, experiment: str) -> Listing:
        """The last listing (empty if none yet): read by a poll right after ``pods``."""
        with self._lock:
            return self._listings.setdefault((namespace, experiment), Listing())

    def last(self, namespace: str, experiment: str) -> Listing | None:
        with self._lock:
            return self._listings.get((namespace, experiment))

    def forget(self, namespace: str, experiment: str) -> None:
        with self._lock:
            self._listings.pop((namespace, experiment), None)

    def pods(self, namespace: str, experiment: str, *, force: bool = False) -> dict[str, dict]:
        """The experiment's pods by name; one list call per ``list_interval_s`` at most."""
        with self._lock:
            listing = self._listings.setdefault((namespace, experiment), Listing())
            fresh = time.monotonic() - listing.at < self.list_interval_s
        if fresh and not force:
            return listing.pods
        sent = time.monotonic()
        try:
            listed = self.api.list_pods(namespace, label_selector=f"{pod_spec.LABEL_EXPERIMENT}={experiment}")
            pods = {p["metadata"]["name"]: p for p in listed
                    if (p["metadata"].get("annotations") or {}).get(pod_spec.ANNOTATION_TRIAL_KEY)}
            waiting = {name for name, pod in pods.items() if pod_spec.unschedulable(pod) is not None}
            autoscaler = self._autoscaler_events(namespace, waiting) if waiting else {}
        except Exception as error:  # noqa: BLE001 - keep the last listing; results still flow
            log.warning("listing the pods of %s/%s failed: %s", namespace, experiment, error)
            return listing.pods
        workloads, local_queues = self._kueue_objects(namespace, pods)
        with self._lock:
            listing.at, listing.pods, listing.autoscaler = sent, pods, autoscaler
            listing.workloads, listing.local_queues = workloads, local_queues
        return pods

    def _kueue_objects(self, namespace: str, pods: Mapping[str, dict]) -> tuple[dict[str, dict], dict[str, dict]]:
        """For the pods Kueue gates: their Workloads (quota reserved, a check pending:
        Provisioning) and LocalQueues (how many wait there).  Read only while some pod is
        gated; unreadable (no RBAC for Kueue's kinds): the pods still say Queued."""
        gated = [pod for pod in pods.values() if kueue.gated(pod)]
        if not gated:
            return {}, {}
        uids = {pod["metadata"].get("uid") for pod in gated}
        queues = {(pod["metadata"].get("labels") or {}).get(kueue.QUEUE_LABEL) for pod in gated} - {None}
        try:
            workloads = {kueue.workload_owner(w): w for w in self.kueue.list_workloads(namespace, uids)
                         if kueue.workload_owner(w) in uids}
            if uids - set(workloads) and self._full_workload_list_due(namespace):
                # a Kueue that does not label its Workloads (or not yet): the namespace's, paginated,
                # at most every KUEUE_FULL_LIST_INTERVAL_S
                workloads.update({kueue.workload_owner(w): w for w in self.kueue.list_workloads(namespace)
                                  if kueue.workload_owner(w) in uids})
            local_queues = {name: found for name in queues
                            if (found := self.kueue.local_queue(namespace, name)) is not None}
        except Exception as error:  # noqa: BLE001 - see above
            log.warning("reading Kueue's Workloads and LocalQueues in %s failed: %s", namespace, error)
            return {}, {}
        return workloads, local_queues

    def _full_workload_list_due(self, namespace: str) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._full_workload_lists.get(namespace, -math.inf) < KUEUE_FULL_LIST_INTERVAL_S:
                return False
            self._full_workload_lists[namespace] = now
            return True

    def kueue_stop_message(self, key: str, pod_name: str) -> str | None:
        """Why Kueue stopped ``pod_name``, from its event; None if Kueue did not.  Read when a
        trial's pod vanished (one call, rarely), whether or not this process started it."""
        namespace = TrialKey.parse(key).namespace
        try:
            events = self.api.list_events(namespace, f"involvedObject.kind=Pod,involvedObject.name={pod_name}")
            return kueue.stop_message(events, pod_name)
        except Exception as error:  # noqa: BLE001 - unreadable: taken as gone, still a cluster fault
            log.warning("reading the events of pod %s/%s failed: %s", namespace, pod_name, error)
            return None

    def _autoscaler_events(self, namespace: str, pods: set[str]) -> dict[str, str]:
        """The cluster autoscaler's latest word on each pending pod (TriggeredScaleUp,
        NotTriggerScaleUp): whether the cluster grows for it, shown with the Queued reason."""
        latest: dict[str, tuple[str, str]] = {}
        for event in self.api.list_events(namespace, "involvedObject.kind=Pod,source=cluster-autoscaler"):
            name = (event.get("involvedObject") or {}).get("name")
            if name not in pods:
                continue
            when = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp") or ""
            if name not in latest or when[:19] >= latest[name][0]:
                latest[name] = (when[:19], f"cluster-autoscaler {event.get('reason')}: {event.get('message', '')}")
        return {name: text for name, (_, text) in latest.items()}


def trial_of(pod: Mapping[str, Any]) -> str:
    """The trial a listed pod runs (its annotation)."""
    key = (pod["metadata"].get("annotations") or {}).get(pod_spec.ANNOTATION_TRIAL_KEY, "")
    return TrialKey.parse(key).trial if key else ""


def attempt_of(pod: Mapping[str, Any]) -> int:
    """The attempt a listed pod runs (its label)."""
    try:
        return int((pod["metadata"].get("labels") or {}).get(pod_spec.LABEL_ATTEMPT, 0))
    except ValueError:
        return 0
