"""Events posted by the operator's store (k8s/events.py, issue 26) on the real API server:
in the background, through the request gate, and a repeat is the same Event counted, not
a new object (as client-go's recorder does)."""
from __future__ import annotations

import asyncio

import kubernetes
import pytest

from kubetune.k8s import store as kube_store
from kubetune.k8s.client import EXPERIMENT_LABEL, GROUP, TRIALS, VERSION

from kube_fixtures import wait_for
from waiting import until

pytestmark = pytest.mark.integration


def test_trial_events_are_posted_once_and_counted_on_repeat(kube_cluster, namespace):
    kubernetes.config.load_kube_config(str(kube_cluster.kubeconfig))
    api = kubernetes.client.CustomObjectsApi()
    trial = api.create_namespaced_custom_object(GROUP, VERSION, namespace, TRIALS, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial",
        "metadata": {"name": "noisy-0", "labels": {EXPERIMENT_LABEL: "noisy"}},
        "spec": {"experiment": "noisy", "index": 0, "parameters": {"x": 0}}})
    core = kubernetes.client.CoreV1Api()

    def events() -> list:
        return [e for e in core.list_namespaced_event(namespace).items if e.involved_object.name == "noisy-0"]

    async def post(times: int, reason: str = "ResultRefused") -> None:
        store = kube_store.KubeStore(namespace, "noisy")
        for _ in range(times):
            await store.trial_event("noisy-0", "Warning", reason, "a result was refused: too large")
        # the poster runs on this loop: keep it alive until it has nothing left to post
        poster = kube_store._events()
        await until(lambda: not (poster.queue or poster._workers), "the Events posted")

    async def first_then_repeat() -> None:
        await post(3)
        wait_for(lambda: len(events()) == 1, timeout=30, message="one Event for three posts")
        await post(2)            # posted already: counted on the same Event
        await post(1, reason="OtherReason")

    asyncio.run(first_then_repeat())
    wait_for(lambda: len(events()) == 2, timeout=30, message="a second Event, of another reason")
    by_reason = {e.reason: e for e in events()}
    repeated = by_reason["ResultRefused"]
    assert repeated.count == 5
    assert repeated.involved_object.uid == trial["metadata"]["uid"] and repeated.involved_object.kind == "Trial"
    assert repeated.last_timestamp >= repeated.first_timestamp
    assert by_reason["OtherReason"].count == 1
