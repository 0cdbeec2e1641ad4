"""A control plane with the kube-scheduler, kwok's fake nodes and a real Kueue manager.

``kueue_cluster`` (module): etcd + kube-apiserver + kube-controller-manager +
kube-scheduler, kwok managing one fake node with 16 CPUs (so the ClusterQueue's quota,
not the node, is what binds), and Kueue's manager built from its Go module and run as a
host process with its webhooks (``kubetune.devcluster.kueue``).  A pod that names a
LocalQueue is gated by Kueue's webhook until Kueue admits it; then the kube-scheduler
binds it and kwok makes it Running.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from kubetune.devcluster import ControlPlane
from kubetune.devcluster.kueue import KueueManager
from kubetune.devcluster.kueue_build import ensure_kueue
from kubetune.devcluster.kwok import FakeNodes
from pod_fixtures import build_scheduler_cluster, kwok_plane, progress

__all__ = ["KueueCluster", "kueue_cluster"]


@dataclass
class KueueCluster:
    kubeconfig: Path
    plane: ControlPlane
    fake_nodes: FakeNodes
    kueue: KueueManager

    def api_client(self):
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))


@pytest.fixture(scope="module")
def kueue_cluster(request, tmp_path_factory):
    build_scheduler_cluster(request)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():   # a cold build takes minutes: show progress
        ensure_kueue(log=progress)
    root = tmp_path_factory.mktemp("kueue-cluster")
    with kwok_plane(root, {"cpu-0": {"cpu": "16", "memory": "64Gi", "pods": "110"}}) as (plane, fake):
        manager = KueueManager(plane.kubeconfig, root / "kueue", die_with_parent=True, log=progress)
        try:
            manager.start()
            yield KueueCluster(plane.kubeconfig, plane, fake, manager)
        finally:
            manager.stop()
