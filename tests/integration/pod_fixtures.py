"""A control plane with the kube-scheduler and kwok's fake GPU nodes, for pod trials.

``gpu_cluster`` (module): etcd + kube-apiserver + kube-controller-manager +
kube-scheduler (a plane of its own: the shared ``kube_cluster`` has no scheduler),
and kwok managing two fake nodes with 2 ``nvidia.com/gpu`` each.  kwok makes a pod
bound to a fake node Running, and ends it when a test sets the pod's
``kubetune.dev/simulate-exit`` annotation (see ``kubetune.devcluster.kwok``).

``pod_namespace`` and ``pod_operator`` (module): one namespace and one
``kubetune operator`` process (its ingest endpoint on a free port) for the module.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from kubetune.devcluster import ControlPlane, ensure_binaries
from kubetune.devcluster.kwok import FakeNodes, ensure_kwok
from kubetune.devcluster.processes import free_port
from kube_fixtures import temporary_namespace
from operator_fixtures import OperatorProcess

__all__ = ["GpuCluster", "gpu_cluster", "pod_namespace", "pod_operator", "GPU_NODES", "GPUS_PER_NODE"]

GPU_NODES = ("gpu-0", "gpu-1")
GPUS_PER_NODE = 2


@dataclass
class GpuCluster:
    kubeconfig: Path
    plane: ControlPlane
    fake_nodes: FakeNodes

    def api_client(self):
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def kwok_plane(root: Path, nodes: Mapping[str, Mapping[str, str]]) -> Iterator[tuple[ControlPlane, FakeNodes]]:
    """A control plane with the kube-scheduler and kwok's fake ``nodes`` (name -> capacity),
    stopped afterwards; the binaries must be built (``ensure_binaries``, ``ensure_kwok``)."""
    plane = ControlPlane(root / "plane", with_scheduler=True, die_with_parent=True, log=progress)
    fake = FakeNodes(plane.kubeconfig, root / "kwok", die_with_parent=True, log=progress)
    try:
        plane.start()
        fake.start()
        with plane.api_client() as api:
            for name, capacity in nodes.items():
                fake.add_node(api, name, dict(capacity))
        yield plane, fake
    finally:
        fake.stop()
        plane.stop()


def build_scheduler_cluster(request) -> None:
    """The control plane with scheduler and kwok, built once per machine (progress shown)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():   # a cold build takes minutes: show progress
        ensure_binaries(["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"], log=progress)
        ensure_kwok(log=progress)


@pytest.fixture(scope="module")
def gpu_cluster(request, tmp_path_factory):
    build_scheduler_cluster(request)
    nodes = {name: {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
             for name in GPU_NODES}
    with kwok_plane(tmp_path_factory.mktemp("gpu-cluster"), nodes) as (plane, fake):
        yield GpuCluster(plane.kubeconfig, plane, fake)


@pytest.fixture(scope="module")
def pod_namespace(gpu_cluster):
    with temporary_namespace(gpu_cluster, "kt-pods-") as name:
        yield name


@pytest.fixture(scope="module")
def pod_operator(gpu_cluster, pod_namespace, tmp_path_factory):
    # no Ray: pod Experiments never start it ("local" is only the default for Ray ones)
    # a fixed port: trial pods keep the ingest URL they were started with across operator restarts
    process = OperatorProcess(gpu_cluster.kubeconfig, "local", tmp_path_factory.mktemp("pod-operator"),
                              pod_namespace,
                              extra_args=("--pod-executor", "--pod-namespace-opt-in",
                                          "--ingest-port", str(free_port()))).start()
    yield process
    process.stop_and_report()
