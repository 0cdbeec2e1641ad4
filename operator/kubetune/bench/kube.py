"""Workload 4: workloads through the full operator on a real API server.

The embedded control plane (``devcluster.ControlPlane``: etcd, kube-apiserver,
kube-controller-manager), a Ray head of its own per workload (``ray start --head``
with the workload's logical CPUs), and ``kubetune operator`` as a subprocess, as
users run it.  Measured per Experiment:

- API write requests: the delta of the apiserver's ``apiserver_request_total``
  (its ``/metrics``) for the write verbs on experiments, trials and events, from
  just before the Experiment is created until the operator's writes settle after it
  succeeded; the benchmark's own ``create`` of the Experiment is not counted.
- the Experiment object's size at the end: its JSON as the API server returns it
  (``managedFields`` and kopf's annotations included);
- the operator's peak resident memory: ``VmHWM`` of its process.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

from kubetune.bench.workloads import Workload
from kubetune.devcluster.processes import free_port, terminate

GROUP, VERSION = "kubetune.dev", "v1alpha1"
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}
COUNTED_RESOURCES = {"experiments", "trials", "events"}
_SAMPLE = re.compile(r'^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Log = Callable[[str], None]


def parse_write_counts(metrics_text: str) -> dict[str, float]:
    """``apiserver_request_total`` of the write verbs on experiments, trials and events,
    keyed ``"<resource>[/<subresource>] <VERB>"``."""
    counts: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") not in WRITE_VERBS or labels.get("resource") not in COUNTED_RESOURCES:
            continue
        resource = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = f"{resource} {labels['verb']}"
        counts[key] = counts.get(key, 0.0) + float(match["value"])
    return counts


def count_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    keys = set(before) | set(after)
    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in keys}
    return {key: value for key, value in sorted(delta.items()) if value}


class RayHead:
    """``ray start --head --block`` in its own process group, ended with its group."""

    def __init__(self, cpus: int, env: dict[str, str]) -> None:
        self.cpus = cpus
        self.env = env
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ktb-ray-", dir="/tmp"))
        self.process: subprocess.Popen | None = None
        self.address = ""

    def start(self, timeout_s: float = 120.0) -> "RayHead":
        port = free_port()
        log_path = self.temp_dir / "head.log"
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
             "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}", "--num-gpus=0",
             "--include-dashboard=false", "--object-store-memory=100000000",
             f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
             f"--dashboard-port={free_port()}", f"--temp-dir={self.temp_dir}"],
            stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.process.returncode}: {log_path.read_text()[-3000:]}")
            if "This command will now block" in log_path.read_text():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Ray head did not come up in {timeout_s:.0f}s: {log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(30)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.process.pid, signal.SIGKILL)   # raylet, GCS and workers of our head
            except ProcessLookupError:
                pass
            self.process.wait(10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class Operator:
    """``kubetune operator`` as a subprocess: for one namespace, or for all of them
    (``namespace=None``).  ``kill`` (SIGKILL, as an OOM kill) and ``start`` again."""

    def __init__(self, kubeconfig: Path, namespace: str | None, ray_address: str, workdir: Path,
                 env: dict[str, str]) -> None:
        self.label = namespace or "all"
        self.workdir = workdir
        self.results_url = f"sqlite:///{workdir / f'results-{self.label}.db'}"
        self.argv = [sys.executable, "-m", "kubetune", "operator",
                     *(["--namespace", namespace] if namespace else []), "--ray-address", ray_address,
                     "--checkpoint-storage", str(workdir / "checkpoints"), "--log-level", "WARNING",
                     "--results-url", self.results_url]
        self.health_port = free_port()
        self.argv += ["--liveness", f"http://127.0.0.1:{self.health_port}/healthz"]
        self.metrics_port = free_port()
        self.argv += ["--metrics-port", str(self.metrics_port)]
        self.env = {**env, "KUBECONFIG": str(kubeconfig)}
        self.starts = 0
        self.start()

    @property
    def log_path(self) -> Path:
        suffix = f"-{self.starts}" if self.starts > 1 else ""
        return self.workdir / f"operator-{self.label}{suffix}.log"

    def start(self) -> "Operator":
        self.starts += 1
        self.process = subprocess.Popen(self.argv, env=self.env, stdout=open(self.log_path, "w"),
                                        stderr=subprocess.STDOUT)
        return self

    def wait_healthy(self, timeout_s: float = 120.0) -> float:
        """Wait until the operator answers its liveness probe (kopf runs: started up, Ray
        connected), so that what is measured next is its work, not its start; returns
        the seconds waited."""
        return self._wait_for_page(self.health_port, "/healthz", lambda status, body: status == 200, timeout_s,
                                   "answer /healthz")

    def wait_ray_connected(self, address: str, timeout_s: float = 180.0) -> float:
        """Wait until the operator says (its ``kubetune_ray_connected`` gauge) that it is
        connected to the Ray cluster at ``address``: it connects at start-up, before any
        Experiment needs it.  Returns the seconds waited."""
        wanted = f'kubetune_ray_connected{{address="{address}"}} 1.0'
        return self._wait_for_page(self.metrics_port, "/metrics", lambda status, body: wanted in body, timeout_s,
                                   f"connect to Ray at {address}")

    def _wait_for_page(self, port: int, path: str, answered: Callable[[int, str], bool], timeout_s: float,
                       what: str) -> float:
        """Poll the operator's own HTTP page until ``answered(status, body)``, failing at
        once if the operator exits; returns the seconds waited."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if not self.alive():
                raise RuntimeError(f"the operator exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                    if answered(answer.status, answer.read().decode()):
                        return time.monotonic() - began
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the operator did not {what} within {timeout_s:.0f} s")

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def peak_kib(self) -> int | None:
        """VmHWM: the most resident memory the operator process ever had."""
        try:
            with open(f"/proc/{self.process.pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text()[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        terminate(self.process)


class KubeBench:
    """One control plane for every Kubernetes workload of a benchmark run."""

    def __init__(self, log: Log = print) -> None:
        self.log = log
        self.workdir = Path(tempfile.mkdtemp(prefix="ktb-kube-", dir="/tmp"))
        token = os.environ.get("RAY_AUTH_TOKEN") or secrets.token_hex(32)
        # Ray head and operator share one token: a token of another Ray on this machine
        # (~/.ray/auth_token) must not decide whether the operator can connect
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": token}
        self.env.pop("RAY_ADDRESS", None)
        self.plane = None
        self._api = None

    def __enter__(self) -> "KubeBench":
        from kubetune.devcluster import ControlPlane
        self.plane = ControlPlane(self.workdir / "plane", die_with_parent=True, log=self.log).start()
        self._api = self.plane.api_client()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._api is not None:
                self._api.close()
            if self.plane is not None:
                self.plane.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---------------------------------------------------------------- API helpers

    def _custom(self):
        import kubernetes
        return kubernetes.client.CustomObjectsApi(self._api)

    def _core(self):
        import kubernetes
        return kubernetes.client.CoreV1Api(self._api)

    def kubectl_get_trials(self, namespace: str, *extra: str, timeout_s: float = 600) -> int:
        """``kubectl get trials -n NAMESPACE [extra]`` as a user runs it (kubectl pages by
        500); the lines it printed.  RuntimeError with kubectl's message if it failed."""
        from kubetune.devcluster.build import kubectl
        done = subprocess.run([str(kubectl(log=self.log)), "--kubeconfig", str(self.plane.kubeconfig), "get",
                               "trials", "-n", namespace, *extra], capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl get trials {' '.join(extra)}: {done.stderr.strip()}")
        return len(done.stdout.splitlines())

    def metrics_text(self) -> str:
        """The apiserver's ``/metrics``."""
        method, url, headers, body, _ = self._api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
        response = self._api.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
        response.read()
        return response.data.decode()

    def write_counts(self) -> dict[str, float]:
        return parse_write_counts(self.metrics_text())

    def _settled_write_counts(self, quiet_s: float = 2.0, timeout_s: float = 30.0) -> dict[str, float]:
        """Counts once no write happened for ``quiet_s`` (the operator's last flush and
        Events are written just after the phase that ends the run)."""
        counts, since = self.write_counts(), time.monotonic()
        deadline = since + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now_counts = self.write_counts()
            if now_counts != counts:
                counts, since = now_counts, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
        return counts

    # ---------------------------------------------------------------- one Experiment

    def run(self, workload: Workload, *, name: str, timeout_s: float = 1800.0) -> dict[str, Any]:
        core = self._core()
        namespace = core.create_namespace({"metadata": {"generateName": "ktb-"}}).metadata.name
        head = RayHead(workload.cpus, self.env).start()
        operator = Operator(self.plane.kubeconfig, namespace, head.address, self.workdir, self.env)
        try:
            return self._measure(workload, name, namespace, operator, timeout_s)
        finally:
            self._clean_up(namespace, name, operator)
            operator.stop()
            head.stop()

    def _clean_up(self, namespace: str, name: str, operator: Operator, timeout_s: float = 120.0) -> None:
        """Delete the Experiment while its operator runs (it removes its finalizer), then
        the namespace, and wait until both are gone: the next workload's write counts
        must not include the garbage collection of this one."""
        from kubernetes.client.exceptions import ApiException

        def gone(read) -> bool:
            try:
                read()
            except ApiException as error:
                if error.status == 404:
                    return True
                raise
            return False

        api, core = self._custom(), self._core()
        deadline = time.monotonic() + timeout_s
        try:
            api.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)
            while operator.alive() and time.monotonic() < deadline and not gone(
                    lambda: api.get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)):
                time.sleep(0.2)
            core.delete_namespace(namespace)
            while time.monotonic() < deadline and not gone(lambda: core.read_namespace(namespace)):
                time.sleep(0.5)
        except Exception as error:  # noqa: BLE001 - the control plane goes away at the end anyway
            self.log(f"cleaning up {namespace}: {error}")

    def _measure(self, workload: Workload, name: str, namespace: str, operator: Operator,
                 timeout_s: float) -> dict[str, Any]:
        api = self._custom()
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": name},
                "spec": workload.kubetune_spec(barrier_dir=tempfile.mkdtemp(prefix="barrier-", dir=self.workdir))}
        before = self.write_counts()
        started = time.time()
        api.create_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", body)
        deadline = time.monotonic() + timeout_s
        finished = None
        while time.monotonic() < deadline:
            experiment = api.get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)
            phase = (experiment.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                finished = time.time()
                break
            if not operator.alive():
                raise RuntimeError(f"the operator exited with {operator.process.returncode}:\n{operator.log_tail()}")
            time.sleep(0.2)
        if finished is None:
            raise RuntimeError(f"{name} did not finish in {timeout_s:.0f}s; status "
                               f"{experiment.get('status')}\noperator log:\n{operator.log_tail()}")
        after = self._settled_write_counts()
        writes = count_delta(before, after)
        writes["experiments POST"] = writes.get("experiments POST", 0) - 1   # the benchmark's own create
        writes = {k: v for k, v in writes.items() if v}
        experiment = api.get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)
        trials = api.list_namespaced_custom_object(GROUP, VERSION, namespace, "trials",
                                                   label_selector=f"kubetune.dev/experiment={name}")["items"]
        from kubetune.controller.conditions import parse_rfc3339
        histories = [(t.get("status") or {}).get("history") or [] for t in trials]
        completions = [parse_rfc3339(t["status"]["completionTime"]) for t in trials
                       if (t.get("status") or {}).get("completionTime")]
        status = experiment.get("status") or {}
        return {
            "started": started, "ended": finished, "makespan_s": finished - started,
            "phase": status.get("phase"), "message": status.get("message"),
            "trials_done": sum(1 for t in trials if (t.get("status") or {}).get("phase") in
                               ("Succeeded", "Failed", "Stopped")),
            # the history on a Trial is a downsampled curve: count results by their seq
            "results": sum((t.get("status") or {}).get("lastResultSeq", -1) + 1 for t in trials),
            "last_processed": max(completions) if completions else finished,
            "offered_at": [[e["offered_at"] for e in h] for h in histories if h and "offered_at" in h[0]],
            "reported_at": [[e["reported_at"] for e in h] for h in histories if h and "reported_at" in h[0]],
            "writes": writes,
            "experiment_bytes": len(json.dumps(experiment, separators=(",", ":"))),
            "experiment_status_bytes": len(json.dumps(status, separators=(",", ":"))),
            "trial_bytes_max": max((len(json.dumps(t, separators=(",", ":"))) for t in trials), default=0),
            "operator_peak_kib": operator.peak_kib(),
        }
