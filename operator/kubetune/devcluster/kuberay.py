"""The KubeRay operator beside the embedded control plane: RayCluster -> Ray pods.

    kuberay = KubeRay(plane, log=print).start()   # CRDs installed, operator Ready
    ...
    kuberay.stop()

The operator (``github.com/ray-project/kuberay/ray-operator``) is built once per machine
from the wrapper module in ``kuberaymod/`` into ``~/.cache/kubetune/bin/kuberay-<v>/``
(see ``gobuild``); its CRDs come from the same module's source (``config/crd/bases``),
so binary and CRDs are always one release.  It runs as a host process with the
plane's admin kubeconfig, as a cluster admin would run a pod of it: pods are what it
creates, and only a real node (``devcluster.node``) runs them.
"""
from __future__ import annotations

import time
from pathlib import Path

import yaml

from kubetune.devcluster import processes
from kubetune.devcluster.crds import install_crds
from kubetune.devcluster.gobuild import GoModule, Log, env_paths

MODULE = "github.com/ray-project/kuberay/ray-operator"
CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")

KUBERAY = GoModule(
    directory=Path(__file__).resolve().parent / "kuberaymod",
    cache_name="kuberay",
    version_of=MODULE,
    packages={"ray-operator": MODULE},
    prebuilt_hint="set KUBETUNE_KUBERAY_OPERATOR to a KubeRay ray-operator binary of the same release",
    overrides=lambda name: env_paths("KUBETUNE_KUBERAY_OPERATOR"),
    build_note="a cold build takes about 3 minutes on 2 cores",
)


class KubeRayError(RuntimeError):
    pass


def crd_documents() -> list[dict]:
    bases = KUBERAY.source() / "config" / "crd" / "bases"
    # 3 MB of YAML: the C loader takes 2 s where the pure-Python one takes 9 (measured, loaded)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [yaml.load((bases / name).read_text(), Loader=loader) for name in CRD_FILES]


class KubeRay(processes.HostProcess):
    name = "kuberay-operator"
    log_name = "kuberay-operator.log"
    record_name = "kuberay.json"
    exited_error = timeout_error = KubeRayError

    def __init__(self, plane, *, log: Log = print):
        super().__init__(plane.kubeconfig, plane.state_dir / "kuberay", die_with_parent=plane.die_with_parent, log=log)
        self.plane = plane

    def start(self, timeout: float = 300.0) -> "KubeRay":
        """Install the CRDs and start the operator; ``timeout`` covers both: 3 MB of CRDs
        took the apiserver 20-100 s at load 15-30 (measured), the operator ~1 s more."""
        binary = KUBERAY.ensure(["ray-operator"], self.log)["ray-operator"]
        started = time.monotonic()
        with self.plane.api_client() as api:
            install_crds(api, documents=crd_documents(), timeout=timeout)
        probe_port = processes.free_port()
        self._spawn([
            str(binary), f"--kubeconfig={self.plane.kubeconfig}",
            f"--metrics-addr=127.0.0.1:{processes.free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--enable-leader-election=false", "--log-stdout-encoder=console",
        ])
        try:
            self.wait_until(started + timeout, lambda: processes.http_ok(f"http://127.0.0.1:{probe_port}/readyz"),
                            "ready (/readyz)")
        except KubeRayError:
            self.stop()
            raise
        self.log(f"kuberay: operator {KUBERAY.version()} Ready in {time.monotonic() - started:.1f}s")
        return self

    @classmethod
    def attach(cls, plane, log: Log = print) -> "KubeRay | None":
        """The operator recorded in ``plane``'s state directory (``devcluster down``), if any."""
        kuberay = cls(plane, log=log)
        return kuberay if kuberay._load_record() else None

    def stop(self) -> None:
        """Stop the operator (before the node: it would recreate the Ray pods being deleted)."""
        super().stop()
