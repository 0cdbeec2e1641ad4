"""The operator's LIST of an Experiment's Trials goes in pages (``limit`` and
``continue``), and every request waits for the client-side rate limit (issue 26: bounded
API use).  Against the real API server."""
from __future__ import annotations

import asyncio

import kubernetes
import pytest

from kubetune.k8s import rate_limit, store as kube_store
from kubetune.k8s.client import EXPERIMENT_LABEL, GROUP, TRIALS, VERSION

pytestmark = pytest.mark.integration


def test_trials_are_listed_in_pages_each_request_rate_limited(kube_cluster, namespace, monkeypatch):
    kubernetes.config.load_kube_config(str(kube_cluster.kubeconfig))
    api = kubernetes.client.CustomObjectsApi()
    for index in range(5):
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, TRIALS, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial",
            "metadata": {"name": f"paged-{index}", "labels": {EXPERIMENT_LABEL: "paged"}},
            "spec": {"experiment": "paged", "index": index, "parameters": {"x": index}}})
    monkeypatch.setattr(kube_store, "LIST_PAGE", 2)
    store = kube_store.KubeStore(namespace, "paged")
    limits = []
    real_list = store._api.list_namespaced_custom_object

    def listing(*args, **kwargs):         # the real request, with what it asked for noted
        limits.append((kwargs.get("limit"), bool(kwargs.get("_continue"))))
        return real_list(*args, **kwargs)
    monkeypatch.setattr(store._api, "list_namespaced_custom_object", listing)
    # 4 requests a second, a burst of 1, on a clock that stands still: no token comes back, so
    # whatever a page takes, the second waits 0.25 s and the third 0.5 s
    monkeypatch.setattr(rate_limit, "_bucket", rate_limit.TokenBucket(qps=4.0, burst=1, clock=lambda: 0.0))

    trials = asyncio.run(store.list_trials())
    assert sorted(t["metadata"]["name"] for t in trials) == [f"paged-{i}" for i in range(5)]
    assert limits == [(2, False), (2, True), (2, True)]
    assert rate_limit.bucket().waited == 2       # the second and third pages waited for a token


def test_lists_asked_together_are_one_request_and_each_gets_its_own_trials(kube_cluster, namespace, monkeypatch):
    # issue 26: Experiments applied at once LIST their Trials before creating any; those of
    # a namespace waiting together share one LIST (k8s/trial_lists.py), a set-based selector
    kubernetes.config.load_kube_config(str(kube_cluster.kubeconfig))
    api = kubernetes.client.CustomObjectsApi()
    for experiment in ("left", "right", "other"):
        for index in range(3):
            api.create_namespaced_custom_object(GROUP, VERSION, namespace, TRIALS, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial",
                "metadata": {"name": f"{experiment}-{index}", "labels": {EXPERIMENT_LABEL: experiment}},
                "spec": {"experiment": experiment, "index": index, "parameters": {"x": index}}})
    stores = [kube_store.KubeStore(namespace, name) for name in ("left", "right")]
    selectors = []
    real_list = stores[0]._api.list_namespaced_custom_object   # one client, shared by every store

    def listing(*args, **kwargs):
        selectors.append(kwargs.get("label_selector"))
        return real_list(*args, **kwargs)
    monkeypatch.setattr(stores[0]._api, "list_namespaced_custom_object", listing)
    monkeypatch.setattr(stores[1]._api, "list_namespaced_custom_object", listing)
    # no token left and none coming back (the clock stands still at the start): both wait
    bucket = rate_limit.TokenBucket(qps=4.0, burst=1, clock=lambda: 0.0)
    bucket.delay()
    monkeypatch.setattr(rate_limit, "_bucket", bucket)

    async def both():
        return await asyncio.gather(*(store.list_trials() for store in stores))
    left, right = asyncio.run(both())
    assert sorted(t["metadata"]["name"] for t in left) == ["left-0", "left-1", "left-2"]
    assert sorted(t["metadata"]["name"] for t in right) == ["right-0", "right-1", "right-2"]
    assert selectors == [f"{EXPERIMENT_LABEL} in (left,right)"]
