"""Container logs for kwok's fake pods: ``kubectl logs`` (``pods/log``) on a devcluster.

kwok serves a kubelet's ``/containerLogs`` endpoint (``--server-address``) from
files named by ``Logs`` objects (kwok.x-k8s.io/v1alpha1, one per pod, watched with
``--enable-crds=Logs``); its fake nodes publish that endpoint (``daemonEndpoints``
and their InternalIP), so the kube-apiserver proxies ``pods/log`` there as it would
to a kubelet (without ``--kubelet-certificate-authority`` it does not check the
kubelet's serving certificate, which is kwok's built-in one).

    install_logs_crd(api_client)                     # before kwok starts (FakeNodes does it)
    log = ContainerLog(path)
    serve_container_log(api_client, "ns", "pod", "train", log.path)
    log.print("epoch 1 done")                        # what the container prints, in CRI log format
"""
from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

from kubetune.devcluster.crds import install_crds

GROUP = "kwok.x-k8s.io"
VERSION = "v1alpha1"
LOGS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": f"logs.{GROUP}"},
    "spec": {"group": GROUP, "scope": "Namespaced",
             "names": {"kind": "Logs", "listKind": "LogsList", "plural": "logs", "singular": "logs"},
             "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def install_logs_crd(api_client: Any, timeout: float = 30.0) -> None:
    """Create kwok's ``Logs`` CRD and wait until it is served."""
    install_crds(api_client, documents=[LOGS_CRD], timeout=timeout)


def serve_container_log(api_client: Any, namespace: str, pod: str, container: str, path: str | Path) -> None:
    """Make kwok serve ``path`` as the log of ``container`` in ``pod``."""
    from kubernetes import client
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, "logs", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Logs", "metadata": {"name": pod, "namespace": namespace},
        "spec": {"logs": [{"containers": [container], "logsFile": str(path), "follow": True}]},
    })


class ContainerLog:
    """A container's log file in the CRI format the kubelet (and kwok) read:
    ``<RFC3339Nano time> stdout F <text>``, one line per line printed."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.touch()

    def print(self, *lines: str, stream: str = "stdout") -> None:
        with self.path.open("a") as handle:
            for line in lines:
                now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                handle.write(f"{now} {stream} F {line}\n")
