"""A real Kubernetes API for the integration tests.

``kube_cluster`` (session): etcd + kube-apiserver + kube-controller-manager started by
``kubetune.devcluster.ControlPlane`` in a temporary directory (the binaries are built
on first use and cached), with kubetune's CRDs installed.  With
``KUBETUNE_TEST_KUBECONFIG=<path>`` the tests use that cluster instead (e.g. kind with
KubeRay); the CRDs are installed into it.

``namespace`` (function): a fresh namespace, deleted after the test
(``temporary_namespace`` makes one for fixtures of other scopes and clusters).

``kubectl`` (session): the project's own kubectl (built from the same Go module as the
control plane), bound to ``kube_cluster``: the user's path, YAML 1.1 parsing included.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from kubetune.devcluster import ControlPlane, ensure_binaries, install_crds
from kubetune.devcluster.build import kubectl as kubectl_binary

__all__ = ["KubeCluster", "Kubectl", "kube_cluster", "kubectl", "namespace", "temporary_namespace", "wait_for"]


@dataclass
class KubeCluster:
    kubeconfig: Path
    plane: ControlPlane | None = None  # None: an existing cluster (KUBETUNE_TEST_KUBECONFIG)

    def api_client(self):
        """A new, ready ``kubernetes.client.ApiClient`` (close it, or use it in ``with``)."""
        from kubernetes import config
        return config.new_client_from_config(config_file=str(self.kubeconfig))


@dataclass
class Kubectl:
    binary: Path
    kubeconfig: Path

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run ``kubectl <args>``; with ``check``, a non-zero exit fails the test with stderr."""
        done = subprocess.run([str(self.binary), "--kubeconfig", str(self.kubeconfig), *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done


def wait_for(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.1,
             message: str = "condition") -> object:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {message}")
        time.sleep(interval)


@contextlib.contextmanager
def temporary_namespace(cluster, prefix: str) -> Iterator[str]:
    """A new namespace named ``<prefix><random>`` on ``cluster`` (anything with
    ``api_client()``), deleted afterwards."""
    from kubernetes import client

    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        name = core.create_namespace({"metadata": {"generateName": prefix}}).metadata.name
        try:
            yield name
        finally:
            release_experiments(api, name)
            # the namespace controller finishes the deletion in the background
            core.delete_namespace(name)


def release_experiments(api, namespace: str) -> None:
    """Take kubetune's finalizer off the Experiments left in ``namespace``: their operator
    has stopped by now (fixtures end in reverse order), and with the finalizer on, the
    namespace would stay Terminating for the rest of the session, its controller listing
    every resource type in it every 15 s: dozens of them slowed the API server, and every
    later test with it, two- to threefold."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kubetune.k8s.client import GROUP, VERSION
    custom = client.CustomObjectsApi(api)
    try:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "experiments")["items"]
    except ApiException as error:
        if error.status == 404:
            return
        raise
    for item in items:
        if not item["metadata"].get("finalizers"):
            continue
        try:
            custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", item["metadata"]["name"],
                                                  {"metadata": {"finalizers": None}})
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.fixture(scope="session")
def kube_cluster(request, tmp_path_factory):
    existing = os.environ.get("KUBETUNE_TEST_KUBECONFIG")
    if existing:
        cluster = KubeCluster(Path(existing).expanduser())
        with cluster.api_client() as api:
            install_crds(api)
        yield cluster
        return

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # a cold build takes minutes: show its progress instead of a silent pause
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        ensure_binaries(["etcd", "kube-apiserver", "kube-controller-manager"], log=log)

    # die_with_parent: even a SIGKILLed test run leaves no control plane behind
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane"), die_with_parent=True, log=log)
    try:
        plane.start()
        yield KubeCluster(plane.kubeconfig, plane)
    finally:
        plane.stop()


@pytest.fixture
def namespace(kube_cluster):
    with temporary_namespace(kube_cluster, "kt-test-") as name:
        yield name


@pytest.fixture(scope="session")
def kubectl(request, kube_cluster):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # a first build takes a minute or more
        binary = kubectl_binary(log=lambda message: print(message, file=sys.stderr, flush=True))
    return Kubectl(binary, kube_cluster.kubeconfig)
