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
