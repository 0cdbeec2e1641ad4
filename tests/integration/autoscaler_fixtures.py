"""A Ray cluster with a real autoscaler for the integration tests: Ray's fake
multi-node provider (``RAY_FAKE_CLUSTER=1``, provider ``fake_multinode``) adds and
removes worker nodes as local raylet processes, driven by the same v1 autoscaler
(``monitor.py``) that runs on a cloud cluster.

The head has no GPUs; one worker node type offers 1 GPU (min 0, max 2). Ray's
wheel does not ship the provider's example config, so the config is written here.
The head's node address is loopback and the fake nodes join its GCS there
(``gcs_address`` in the provider config; the default is this host's IP and port
6379, which may be another Ray). Ray itself gives the fake nodes, and a driver
connecting to 127.0.0.1, this machine's outward address, as for any local node.
Token auth comes from ray_fixtures (set in os.environ at import, inherited by the
head, its autoscaler and every fake node).

``RayHead.stop()`` does what `ray stop` does, for this head only: it signals every
process of the head's session and every process naming its temp dir (the fake
nodes, which the autoscaler starts with ``shutdown_at_exit=False``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kube_fixtures import temporary_namespace, wait_for
from kubetune.devcluster.processes import free_port
from operator_fixtures import OperatorProcess
from ray_fixtures import RAY_ENV, end_processes, session_processes, use_test_auth_token, wait_for_head

__all__ = ["RayHead", "autoscaling_ray", "scaled_down", "module_namespace", "autoscaling_operator"]

GPU_NODE_TYPE = "gpu-worker"
HEAD_CPUS = 2
GPU_NODE = {"CPU": 2, "GPU": 1}
MAX_GPU_NODES = 2
# Seconds a fake node may sit idle before the autoscaler removes it: the GPU nodes one
# test scaled up serve the next tests of the module (a node start costs this 2-core
# machine several CPU-seconds), while a cluster left alone still shrinks back.
IDLE_TIMEOUT_S = 60


def autoscaling_config(gcs_port: int) -> dict:
    """The cluster YAML (as a dict) for ``ray start --head --autoscaling-config``.

    Fields follow Ray's fake_multi_node/example.yaml; the v1 autoscaler reads the file
    as is (no defaults are filled in), so every key it touches is present."""
    return {
        "cluster_name": "kubetune-fake",
        "max_workers": MAX_GPU_NODES,
        "provider": {
            "type": "fake_multinode",
            "gcs_address": f"127.0.0.1:{gcs_port}",   # default would be <this host's IP>:6379
            "launch_multiple": True,                   # a launch of 2 starts 2 nodes, not 1
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": HEAD_CPUS, "GPU": 0}, "node_config": {},
                                 "max_workers": 0},
            GPU_NODE_TYPE: {"resources": {**GPU_NODE, "object_store_memory": 80_000_000},
                            "node_config": {}, "min_workers": 0, "max_workers": MAX_GPU_NODES},
        },
        "head_node_type": "ray.head.default",
        "upscaling_speed": 2.0,
        "idle_timeout_minutes": IDLE_TIMEOUT_S / 60.0,
        "auth": {}, "docker": {},
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [],
    }


class RayHead:
    """One ``ray start --head --block`` process (optionally with the fake autoscaler),
    restartable at the same port, as a Ray head that is stopped and started again."""

    def __init__(self, *, autoscaling: bool, num_cpus: int = HEAD_CPUS, num_gpus: int = 0,
                 port: int | None = None) -> None:
        self.autoscaling = autoscaling
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.temp_dir: Path | None = None      # of the current (or last) start
        self._temp_dirs: list[Path] = []
        self.starts = 0

    def start(self, timeout_s: float = 90.0) -> "RayHead":
        # A short path: Ray's unix sockets live under it and have a 107-byte limit.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="kt-as-", dir="/tmp"))
        self._temp_dirs.append(self.temp_dir)
        self.starts += 1
        use_test_auth_token()
        env = {**os.environ, **RAY_ENV}
        command = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
                   f"--port={self.port}", "--node-ip-address=127.0.0.1",
                   f"--num-cpus={self.num_cpus}", f"--num-gpus={self.num_gpus}",
                   "--include-dashboard=false", "--object-store-memory=80000000",
                   f"--ray-client-server-port={free_port()}",
                   f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-port={free_port()}",
                   f"--temp-dir={self.temp_dir}"]
        if self.autoscaling:
            config = self.temp_dir / "autoscaling.yaml"
            config.write_text(json.dumps(autoscaling_config(self.port), indent=1))   # JSON is YAML
            command.append(f"--autoscaling-config={config}")
            env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
        log_path = self.temp_dir / "head.log"
        self.process = subprocess.Popen(command, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
        if wait_for_head(self.process, log_path, timeout_s):
            return self
        self.stop()
        raise RuntimeError("the Ray head did not come up in time: " + log_path.read_text()[-3000:])

    def _processes(self) -> list[int]:
        """Live processes of this head: its session (GCS, raylet, autoscaler, workers) and
        anything else naming its temp dir (the fake nodes the autoscaler started)."""
        return session_processes(self.process.pid, str(self.temp_dir).encode())

    def stop(self, *, grace_s: float = 5.0, remove_files: bool = True) -> None:
        """End the head, its autoscaler and every fake node, as `ray stop` would for this
        head only: SIGTERM to each process at once, SIGKILL to what is left after
        ``grace_s`` (`ray start --block` alone takes long to wind down on SIGTERM)."""
        if self.process is not None:
            end_processes(self._processes, grace_s)
            self.process.wait(10)
            left = self._processes()
            self.process = None
            if left:
                raise RuntimeError(f"processes of the Ray head at {self.address} survived SIGKILL: {left}")
        if remove_files:
            for temp_dir in self._temp_dirs:
                shutil.rmtree(temp_dir, ignore_errors=True)
            self._temp_dirs.clear()


def autoscaler_status() -> dict:
    """The v1 autoscaler's last status (``ray status`` reads the same): the load it saw,
    including the standing ``request_resources`` demand, and its node counts.
    Needs a driver connected to the cluster (``ray.init``)."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get
    data = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    return json.loads(data) if data else {}


def requested_bundles() -> list[dict]:
    """The standing ``ray.autoscaler.sdk.request_resources`` request, as the v1
    autoscaler reads it from the GCS key-value store."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get
    data = _internal_kv_get(ray_constants.AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
    return json.loads(data) if data else []


def gpu_nodes() -> int:
    """Alive nodes with GPUs (this process must be connected to the cluster)."""
    import ray
    return sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU"))


def gpus_present() -> float:
    import ray
    return sum(n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n.get("Alive"))


@pytest.fixture(scope="module")
def autoscaling_ray():
    """A Ray head with 2 CPUs, 0 GPUs and the fake autoscaler (GPU nodes: min 0, max 2),
    shared by the tests of one module; this process is connected to it as a driver."""
    import ray
    head = RayHead(autoscaling=True).start()
    try:
        if ray.is_initialized():
            ray.shutdown()
        ray.init(address=head.address, namespace="kubetune-test", log_to_driver=False)
        yield head
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.stop()


@pytest.fixture
def scaled_down(autoscaling_ray):
    """The cluster without GPU nodes (at once for the first test of a module)."""
    wait_for(lambda: gpu_nodes() == 0, timeout=IDLE_TIMEOUT_S + 60, interval=0.5,
             message="the fake autoscaler to remove its GPU nodes")
    return autoscaling_ray


@pytest.fixture(scope="module")
def module_namespace(kube_cluster):
    """One namespace for the tests of a module (they share one operator)."""
    with temporary_namespace(kube_cluster, "kt-queue-") as name:
        yield name


@pytest.fixture(scope="module")
def autoscaling_operator(kube_cluster, autoscaling_ray, module_namespace, tmp_path_factory):
    """``kubetune operator`` pointed at the autoscaling head, one for the module: the
    Experiments of its tests share one ResourceLedger, as on a real cluster."""
    workdir = tmp_path_factory.mktemp("autoscaling-operator")
    process = OperatorProcess(kube_cluster.kubeconfig, autoscaling_ray.address, workdir, module_namespace,
                              extra_args=("--ingest-port", str(free_port()))).start()
    yield process
    process.stop_and_report()
