"""kwok (Kubernetes WithOut Kubelet): fake nodes, and the pods bound to them, for a
devcluster with the kube-scheduler.

    binary = ensure_kwok()                       # built once into the cache
    fake = FakeNodes(plane, state_dir).start()   # kwok process, managing nodes labelled type=kwok
    fake.add_node("gpu-0", {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "2"})
    ...
    fake.stop()

The binary comes from ``KUBETUNE_KWOK`` or the cache
(``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/kwok-<version>/kwok``); otherwise it is
built from the wrapper module ``kwokmod/`` (kwok has its own Kubernetes client
versions, so it cannot share gomod/).

kwok only simulates what its stages say.  The stages here: nodes become Ready; a
pod bound to a fake node becomes Running; a pod whose
``kubetune.dev/simulate-exit`` annotation is set terminates with that exit code
(``0`` Succeeded, anything else Failed) and the optional
``kubetune.dev/simulate-reason`` (default ``Completed``/``Error``, e.g. ``OOMKilled``):
a test plays the container this way; a pod being deleted goes away.
"""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from kubetune.devcluster import processes
from kubetune.devcluster.build import BuildError, Log, cache_root

KWOK_MODULE_DIR = Path(__file__).resolve().parent / "kwokmod"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
NODE_LABEL = "type"
NODE_LABEL_VALUE = "kwok"
EXIT_ANNOTATION = "kubetune.dev/simulate-exit"
REASON_ANNOTATION = "kubetune.dev/simulate-reason"


def kwok_version() -> str:
    text = (KWOK_MODULE_DIR / "go.mod").read_text()
    match = re.search(r"^[ \t]*(?:require[ \t]+)?sigs\.k8s\.io/kwok[ \t]+(v\S+)", text, re.MULTILINE)
    if not match:
        raise BuildError(f"sigs.k8s.io/kwok is not required by {KWOK_MODULE_DIR / 'go.mod'}")
    return match.group(1)


def kwok_cache_path() -> Path:
    return cache_root() / "bin" / f"kwok-{kwok_version()}" / "kwok"


def find_kwok() -> Path | None:
    override = os.environ.get("KUBETUNE_KWOK")
    for candidate in ([Path(override).expanduser()] if override else []) + [kwok_cache_path()]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_kwok(log: Log = print) -> Path:
    """The kwok binary, built (once per machine) if missing."""
    found = find_kwok()
    if found is not None:
        return found
    target = kwok_cache_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent.parent / f".{target.parent.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if find_kwok() is None:
            _build(target, log)
    found = find_kwok()
    if found is None:
        raise BuildError(f"kwok is still missing after the build ({target})")
    return found


def _build(target: Path, log: Log) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError("kwok is missing and there is no `go` on PATH to build it: install Go >= 1.26, "
                         "or set KUBETUNE_KWOK to a kwok binary")
    env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0")
    env.pop("GOFLAGS", None)   # -mod=mod would rewrite the committed go.mod/go.sum
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent.parent) as tmp:
        out = Path(tmp) / "kwok"
        build_log = Path(tmp) / "go-build.log"
        log(f"devcluster: building kwok {kwok_version()} into {target.parent} "
            "(about 3 minutes cold on 2 cores; later runs reuse it)")
        started = time.monotonic()
        with open(build_log, "wb") as log_file:
            proc = subprocess.Popen([go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out), KWOK_PACKAGE],
                                    cwd=KWOK_MODULE_DIR, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            try:
                next_note = started + 30
                while proc.poll() is None:
                    time.sleep(0.5)
                    if time.monotonic() >= next_note:
                        log(f"devcluster: still building kwok ... {time.monotonic() - started:.0f}s")
                        next_note += 30
            except BaseException:
                proc.terminate()
                proc.wait()
                raise
        if proc.returncode != 0 or not out.is_file():
            tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-30:])
            raise BuildError(f"go build of kwok failed (exit {proc.returncode}):\n{tail}")
        os.replace(out, target)
        log(f"devcluster: built kwok {kwok_version()} in {time.monotonic() - started:.0f}s")


# kwok's stages (kwok.x-k8s.io/v1alpha1): node-initialize and pod-ready follow kwok's own
# "fast" stages; pod-exit replaces its Job-only pod-complete with one a test drives.
STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      allocatable:
      {{ YAML .status.capacity 1 }}
      capacity:
      {{ YAML .status.capacity 1 }}
      nodeInfo:
        architecture: amd64
        kubeletVersion: fake
        operatingSystem: linux
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ with NodeIPWith .spec.nodeName }}
      hostIP: {{ . | Quote }}
      {{ end }}
      {{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ . | Quote }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-exit
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["kubetune.dev/simulate-exit"]'
      operator: 'Exists'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $code := index .metadata.annotations "kubetune.dev/simulate-exit" }}
      {{ $reason := index .metadata.annotations "kubetune.dev/simulate-reason" }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        type: Ready
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        state:
          terminated:
            exitCode: {{ $code }}
            finishedAt: {{ $now | Quote }}
            reason: {{ or $reason (eq $code "0" | ternary "Completed" "Error") | Quote }}
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: {{ eq $code "0" | ternary "Succeeded" "Failed" }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""


class FakeNodes:
    """A kwok process managing the nodes labelled ``type=kwok`` of a control plane."""

    def __init__(self, kubeconfig: str | Path, state_dir: str | Path, *, die_with_parent: bool = True,
                 log: Log = print) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.state_dir = Path(state_dir)
        self.die_with_parent = die_with_parent
        self.log = log
        self.record: processes.ProcessRecord | None = None
        self._popen: subprocess.Popen | None = None

    def start(self) -> "FakeNodes":
        binary = ensure_kwok(self.log)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "kwok.yaml"
        config.write_text(STAGES)
        self.record, self._popen = processes.spawn("kwok", [
            str(binary), f"--kubeconfig={self.kubeconfig}", f"--config={config}",
            f"--manage-nodes-with-label-selector={NODE_LABEL}={NODE_LABEL_VALUE}",
            "--cidr=10.244.0.0/16", "--node-ip=10.0.0.1",
        ], self.state_dir / "kwok.log", die_with_parent=self.die_with_parent)
        return self

    def stop(self) -> None:
        if self.record is not None:
            processes.stop(self.record, self._popen)
            self.record = None

    def add_node(self, api_client: Any, name: str, capacity: Mapping[str, str], timeout: float = 30.0) -> None:
        """Create a fake node with ``capacity`` and wait until kwok reports it Ready."""
        from kubernetes import client
        core = client.CoreV1Api(api_client)
        core.create_node({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {NODE_LABEL: NODE_LABEL_VALUE, "kubernetes.io/hostname": name},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
        })
        deadline = time.monotonic() + timeout
        while True:
            node = core.read_node(name)
            conditions = {c.type: c.status for c in node.status.conditions or []}
            if conditions.get("Ready") == "True" and node.status.allocatable:
                return
            if self._popen is not None and self._popen.poll() is not None:
                raise RuntimeError(f"kwok exited with code {self._popen.returncode}:\n{self.record.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"fake node {name} not Ready after {timeout:.0f}s:\n"
                                   f"{self.record.log_tail() if self.record else ''}")
            time.sleep(0.1)
