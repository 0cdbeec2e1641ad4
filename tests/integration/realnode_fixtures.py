"""The real node for the tests that need every container to really run
(test_real_node*.py): the embedded control plane plus a real node
(kubetune.devcluster.node), kubectl and helm, the operator image built from the
Dockerfile and the chart installed as the README says.

Module-scoped: each test module brings up its own node and releases the machine
lock after it (one node per machine: bridge, iptables, containerd).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from kubernetes import client

from k8s_helpers import GROUP, VERSION, condition
from kube_fixtures import temporary_namespace, wait_for
from kubetune.devcluster.build import ensure_binaries
from kubetune.devcluster.helm import ensure_helm
from kubetune.devcluster.node import images
from kubetune.devcluster.node.node import Node, start_cluster, why_not_here

REPO = Path(__file__).resolve().parents[2]
RELEASE, HOME = "kubetune", "kubetune-system"
DASHBOARD_URL = "http://localhost:8080"      # as a port-forward reaches it: status.dashboard's base
MACHINE_LOCK = Path("/run/kubetune-node.lock")

# for the modules' pytestmark: Linux and root only; the first test carries the module's
# setup (packages, builds, images when cold)
REAL_NODE_MARKS = [pytest.mark.integration,
                   pytest.mark.skipif(bool(why_not_here()), reason=str(why_not_here())),
                   pytest.mark.timeout(3600)]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)



class RealCluster:
    """The plane + node, with the tools a user has: kubectl and helm."""

    def __init__(self, plane, node: Node, kubectl: Path, helm: Path):
        self.plane, self.node, self.kubectl_path, self.helm_path = plane, node, kubectl, helm
        self.kubeconfig = plane.kubeconfig

    def api_client(self):
        return self.plane.api_client()

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> str:
        result = subprocess.run([str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def helm(self, *args: str, timeout: float = 180) -> str:
        result = subprocess.run([str(self.helm_path), f"--kubeconfig={self.kubeconfig}", *args],
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
        return result.stdout


@contextlib.contextmanager
def machine_lock(timeout: float = 3600):
    """One node per machine (bridge, iptables, containerd): wait for another run's."""
    with open(MACHINE_LOCK, "w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run held {MACHINE_LOCK} for {timeout:.0f}s")
                time.sleep(1)
        yield


@pytest.fixture(scope="module")
def real_cluster(request, tmp_path_factory):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with machine_lock():
        with capture.global_and_fixture_disabled():     # cold: packages, builds, images take minutes
            started = time.monotonic()
            tools = ensure_binaries(["kubectl"], log=log)["kubectl"], ensure_helm(log=log)
            plane, node = start_cluster(tmp_path_factory.mktemp("realnode"), log=log, die_with_parent=True)
            log(f"realnode: cluster with a Ready node in {time.monotonic() - started:.0f}s")
        try:
            yield RealCluster(plane, node, *tools)
        finally:
            try:
                node.stop()
            finally:
                plane.stop()


@pytest.fixture(scope="module")
def operator_image(request, real_cluster) -> str:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        started = time.monotonic()
        name = real_cluster.node.load(images.operator_image(images.python_image()))
        log(f"realnode: operator image {name} ready in {time.monotonic() - started:.0f}s")
    return name


def operator_pods(core) -> list:
    pods = core.list_namespaced_pod(HOME, label_selector=f"app.kubernetes.io/instance={RELEASE},"
                                                         "app.kubernetes.io/name=kubetune").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def dashboard_pods(core) -> list:
    pods = core.list_namespaced_pod(HOME, label_selector=f"app.kubernetes.io/instance={RELEASE},"
                                                         "app.kubernetes.io/name=kubetune-dashboard").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


@pytest.fixture(scope="module")
def release(real_cluster, operator_image):
    """``helm install`` of charts/kubetune, as the README says, with the locally built image."""
    repository, tag = operator_image.rsplit(":", 1)
    # the chart's results PVC (default values) needs a volume: this node has no
    # provisioner, so a hostPath PersistentVolume it can bind, writable by the operator
    results = real_cluster.node.dir / "volumes" / "results"
    results.mkdir(parents=True, exist_ok=True)
    results.chmod(0o777)
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "kubetune-results"},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(results)}}}))
    real_cluster.helm("install", RELEASE, str(REPO / "charts" / "kubetune"), "--namespace", HOME,
                      "--create-namespace", "--set", f"image.repository={repository}",
                      "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
                      "--set", "podExecutor.enabled=true", "--set", "podExecutor.clusterWide=true",
                      # the dashboard next to the operator, on its SQLite volume (read-only)
                      "--set", "dashboard.enabled=true", "--set", f"dashboard.baseURL={DASHBOARD_URL}")
    with real_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        try:
            wait_for(lambda: any(ready(p) for p in operator_pods(core)), timeout=180, interval=0.5,
                     message="the operator pod Ready")
        except BaseException:
            print(real_cluster.kubectl("-n", HOME, "describe", "pods"))
            print(real_cluster.kubectl("-n", HOME, "logs", "deploy/" + RELEASE, "--tail=80"))
            raise
    yield real_cluster


@pytest.fixture
def user_namespace(release):
    with temporary_namespace(release, "kt-node-") as name:
        yield name


def get_experiment(api, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)


def wait_succeeded(cluster: RealCluster, namespace: str, name: str, timeout: float,
                   each: Callable[[], object] | None = None) -> dict:
    """The Experiment once Succeeded (fails at once if it Failed); ``each`` runs at every
    poll, to record what happens on the way."""
    with cluster.api_client() as api:
        def finished():
            if each is not None:
                each()
            body = get_experiment(api, namespace, name)
            failed = condition(body, "Failed")
            assert not (failed and failed["status"] == "True"), body["status"]
            done = condition(body, "Succeeded")
            return body if done and done["status"] == "True" else None
        try:
            return wait_for(finished, timeout=timeout, interval=1, message=f"{name} Succeeded")
        except BaseException:
            print(cluster.kubectl("-n", namespace, "get", "experiments,trials,pods", "-o", "wide"))
            print(cluster.kubectl("-n", HOME, "logs", "deploy/" + RELEASE, "--tail=100"))
            raise


def experiment_events(cluster: RealCluster, namespace: str, name: str) -> set[str]:
    listed = json.loads(cluster.kubectl("-n", namespace, "get", "events", "-o", "json",
                                        f"--field-selector=involvedObject.name={name}"))
    return {event["reason"] for event in listed["items"]}


def trial_pods(core, namespace: str, name: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"kubetune.dev/experiment={name}").items
