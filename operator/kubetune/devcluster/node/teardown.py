"""Stopping a node so that nothing is left behind: the steps ``Node.stop`` runs, in its order.

Each step tolerates what is already gone (a pod deleted, a container the kubelet removed
meanwhile, a mount unmounted): a teardown runs after failures too, and a second one must be
harmless.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

from kubetune.devcluster import build
from kubetune.devcluster.node import network
from kubetune.devcluster.node.ctr import Ctr, CtrError

POD_STOP_WAIT_S = 10      # for the kubelet to stop the pods itself (CNI DEL, unmounts) before the kill
TASK_DELETE_WAIT_S = 30


def delete_pods(plane, ctr: Ctr) -> None:
    """Delete every pod while the kubelet still runs, and give it a moment to stop them."""
    from kubernetes import client
    with plane.api_client() as api:
        core = client.CoreV1Api(api)
        for pod in core.list_pod_for_all_namespaces().items:
            try:
                core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
            except client.ApiException as error:
                if error.status != 404:
                    raise
    # the kubelet stops them with their grace period (up to 40 s for the operator's pod):
    # what is still running after the wait, remove_containers kills
    deadline = time.monotonic() + POD_STOP_WAIT_S
    while time.monotonic() < deadline and running_app_containers(ctr):
        time.sleep(0.5)


def running_app_containers(ctr: Ctr) -> list[str]:
    # sandboxes stay until the kubelet's garbage collection: count the app containers
    rows = [line.split() for line in ctr("tasks", "ls").splitlines()[1:]]
    return [row[0] for row in rows if row and row[-1] == "RUNNING" and not _is_sandbox(ctr, row[0])]


def _is_sandbox(ctr: Ctr, container: str) -> bool:
    try:
        info = ctr("containers", "info", container)
    except CtrError as error:
        # the kubelet removed it between `tasks ls` and here: it runs no more, so it is
        # nothing left to wait for (counted like a sandbox, which is not waited on)
        if "not found" in str(error):
            return True
        raise
    return '"io.cri-containerd.kind": "sandbox"' in info


def remove_containers(ctr: Ctr) -> None:
    """Kill and remove every container left, then the snapshots they held."""
    if not ctr.socket.exists():
        return
    for line in ctr("tasks", "ls").splitlines()[1:]:
        if line.split():
            ctr.attempt("tasks", "kill", "-s", "SIGKILL", line.split()[0])
    deadline = time.monotonic() + TASK_DELETE_WAIT_S
    for container in ctr("containers", "ls", "-q").split():
        while True:
            gone = ctr.attempt("tasks", "delete", "-f", container)
            if gone.returncode == 0 or "not found" in gone.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        ctr.attempt("containers", "rm", container)
    for leftover in ctr("snapshots", "ls").splitlines()[1:]:
        parts = leftover.split()
        if parts and parts[-1] == "Active":
            ctr.attempt("snapshots", "rm", parts[0])


def unmount(prefixes: Iterable[str]) -> None:
    """Lazily unmount everything under ``prefixes`` (deepest first) and drop CNI's netns files."""
    prefixes = tuple(prefixes)
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted({m for m in mounts if m.startswith(prefixes)}, key=len, reverse=True):
        network.run("umount", "-l", mount, check=False)
    for netns in Path("/run/netns").glob("cni-*") if Path("/run/netns").exists() else []:
        netns.unlink(missing_ok=True)


def cleanup_kube_proxy() -> None:
    binary = build.KUBERNETES.find("kube-proxy")
    if binary is not None:
        network.run(str(binary), "--cleanup", check=False)
    # the kubelet's canaries (it watches them to notice an iptables flush)
    for table in ("mangle", "nat", "filter"):
        for chain in ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"):
            network.run("iptables", "-w", "-t", table, "-X", chain, check=False)
