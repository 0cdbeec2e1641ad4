"""The operator as users run it: ``kubetune operator`` in its own process, pointed
at the test control plane and the test Ray head.  Tests can SIGKILL and restart it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kubetune.devcluster.processes import terminate

__all__ = ["OperatorProcess", "operator", "experiments_api"]


class OperatorProcess:
    def __init__(self, kubeconfig: Path, ray_address: str, workdir: Path, namespace: str,
                 extra_args: tuple[str, ...] = (), launcher: tuple[str, ...] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.launcher = launcher     # a command that runs the operator's command line (e.g. under seccomp)
        self.extra_args = extra_args
        self.ray_address = ray_address
        self.workdir = workdir
        self.namespace = namespace
        self.process: subprocess.Popen | None = None
        self.starts = 0
        # its own results store, which tests read (kubetune.results)
        self.results_url = f"sqlite:///{workdir / 'results.db'}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self) -> "OperatorProcess":
        self.starts += 1
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "RAY_USAGE_STATS_ENABLED": "0"}
        self.process = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", "kubetune", "operator", "--namespace", self.namespace,
             "--ray-address", self.ray_address, "--checkpoint-storage", str(self.workdir / "checkpoints"),
             "--results-url", self.results_url, *self.extra_args],
            env=env, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    def stop_and_report(self) -> None:
        """Stop (fixture teardown); print the log's tail if the operator failed on its own."""
        self.stop()
        if self.process.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL, None):
            print(self.log()[-5000:])

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob("operator-*.log")))


@pytest.fixture
def operator(kube_cluster, ray_local, namespace, tmp_path):
    process = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, namespace).start()
    yield process
    process.stop_and_report()


@pytest.fixture
def experiments_api(kube_cluster):
    import kubernetes
    with kube_cluster.api_client() as client:
        yield kubernetes.client.CustomObjectsApi(client)
