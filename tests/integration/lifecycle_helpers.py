"""Helpers of the lifecycle tests (issue 15): trial processes, Ray actors left behind,
and operator replicas with leader election."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from kubetune.devcluster.processes import free_port
from recovery_fixtures import OperatorWithEnv

__all__ = ["Replica", "alive", "http_status", "lease_holder", "named_actors"]


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status ``url`` answers with; 0 when nothing answers (a health endpoint
    polled with ``wait_for`` while its operator starts, stops or hangs)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def named_actors(address: str, prefix: str) -> list[str]:
    """Live kubetune actors under a trial-key prefix, as a separate Ray driver sees them
    (the test process stays out of Ray: the operator under test is its only driver)."""
    script = ("import json, ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
              "print(json.dumps([a['name'] for a in ray.util.list_named_actors(all_namespaces=True)]))" % address)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, check=True).stdout
    names = json.loads(out.strip().splitlines()[-1])
    return [name for name in names if name.startswith("kubetune/" + prefix)]


class Replica(OperatorWithEnv):
    """An operator replica with leader election (Lease ``kt`` in its namespace) and its
    own health port (``/healthz`` liveness, ``/readyz`` 200 only while leading)."""

    def __init__(self, kube_cluster, ray_address: str, workdir, namespace: str, identity: str,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.health_port = free_port()
        self.identity = identity
        super().__init__(kube_cluster.kubeconfig, ray_address, workdir, namespace, env={},
                         extra_args=("--leader-election", "--lease-namespace", namespace, "--lease-name", "kt",
                                     "--identity", identity,
                                     "--liveness", f"http://127.0.0.1:{self.health_port}/healthz", *extra_args))

    @property
    def log_path(self):
        # replicas share a workdir (the default checkpoint storage), each its own logs
        return self.workdir / f"replica-{self.identity}-{self.starts}.log"

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob(f"replica-{self.identity}-*.log")))

    def status(self, path: str) -> int:
        return http_status(f"http://127.0.0.1:{self.health_port}{path}")


def lease_holder(kube_cluster, namespace: str) -> str:
    import kubernetes
    with kube_cluster.api_client() as client:
        try:
            lease = kubernetes.client.CoordinationV1Api(client).read_namespaced_lease("kt", namespace)
        except kubernetes.client.exceptions.ApiException:
            return ""
    return lease.spec.holder_identity or ""
