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
pod bound to a fake node becomes Running (with a ``kubetune.dev/simulate-waiting`` annotation
it stays Pending, its containers waiting for that reason); a pod whose
``kubetune.dev/simulate-exit`` annotation is set terminates with that exit code
(``0`` Succeeded, anything else Failed) and the optional
``kubetune.dev/simulate-reason`` (default ``Completed``/``Error``, e.g. ``OOMKilled``):
a test plays the container this way; a pod being deleted goes away.

kwok also serves the kubelet's container-log endpoint on loopback, published as the
fake nodes' InternalIP and kubelet port, so ``pods/log`` works for the pods a test
gives a log file (``kubetune.devcluster.kwok_logs``).
"""
from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from kubetune.devcluster import processes
from kubetune.devcluster.gobuild import GoModule, Log, env_paths
from kubetune.devcluster.kwok_logs import install_logs_crd

NODE_LABEL = "type"
NODE_LABEL_VALUE = "kwok"
EXIT_ANNOTATION = "kubetune.dev/simulate-exit"
REASON_ANNOTATION = "kubetune.dev/simulate-reason"
# the kubelet cannot start the container: it stays waiting with this reason (ImagePullBackOff,
# ...), the pod started at WAITING_SINCE_ANNOTATION (default: now)
WAITING_ANNOTATION = "kubetune.dev/simulate-waiting"
WAITING_SINCE_ANNOTATION = "kubetune.dev/simulate-waiting-since"

KWOK = GoModule(
    directory=Path(__file__).resolve().parent / "kwokmod",
    cache_name="kwok",
    version_of="sigs.k8s.io/kwok",
    packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
    prebuilt_hint="set KUBETUNE_KWOK to a kwok binary",
    overrides=lambda name: env_paths("KUBETUNE_KWOK"),
)


def ensure_kwok(log: Log = print) -> Path:
    """The kwok binary, built (once per machine) if missing."""
    return KWOK.ensure(["kwok"], log)["kwok"]


# kwok's stages (kwok.x-k8s.io/v1alpha1): node-initialize and pod-ready follow kwok's own
# "fast" stages; pod-exit replaces its Job-only pod-complete with one a test drives.
# A statusTemplate is a Go template of the object's new status.

def _stage(name: str, kind: str, match_expressions: list[dict], next_: dict) -> dict:
    """A kwok Stage: what ``next_`` does to the ``kind`` objects the expressions select."""
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": {"resourceRef": {"apiGroup": "v1", "kind": kind},
                     "selector": {"matchExpressions": match_expressions}, "next": next_}}


def _expression(key: str, operator: str, *values: str) -> dict:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def _pod_in_phase(phase: str) -> list[dict]:
    """Pods in ``phase`` that are not being deleted."""
    return [_expression(".metadata.deletionTimestamp", "DoesNotExist"), _expression(".status.phase", "In", phase)]


def _container_statuses(ready: str, state: str) -> str:
    """statusTemplate lines: every container of the pod ``ready`` and in ``state`` (YAML)."""
    return ("containerStatuses:\n"
            "{{ range .spec.containers }}\n"
            "- image: {{ .image | Quote }}\n"
            "  name: {{ .name | Quote }}\n"
            f"  ready: {ready}\n"
            "  restartCount: 0\n"
            "  state:\n"
            + textwrap.indent(state, "    ")
            + "{{ end }}\n")


_NOT_READY = _expression('.status.conditions.[] | select( .type == "Ready" ) | .status', "NotIn", "True")

_NODE_READY = """\
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
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ NodePort }}
allocatable:
{{ YAML .status.capacity 1 }}
capacity:
{{ YAML .status.capacity 1 }}
nodeInfo:
  architecture: amd64
  kubeletVersion: fake
  operatingSystem: linux
phase: Running
"""

_POD_RUNNING = """\
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
""" + _container_statuses("true", """\
running:
  startedAt: {{ $now | Quote }}
""") + """\
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_EXITED = """\
{{ $now := Now }}
{{ $code := index .metadata.annotations "kubetune.dev/simulate-exit" }}
{{ $reason := index .metadata.annotations "kubetune.dev/simulate-reason" }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
""" + _container_statuses("false", """\
terminated:
  exitCode: {{ $code }}
  finishedAt: {{ $now | Quote }}
  reason: {{ or $reason (eq $code "0" | ternary "Completed" "Error") | Quote }}
  startedAt: {{ $now | Quote }}
""") + """\
phase: {{ eq $code "0" | ternary "Succeeded" "Failed" }}
"""

_POD_WAITING = """\
{{ $now := Now }}
{{ $reason := index .metadata.annotations "kubetune.dev/simulate-waiting" }}
{{ $since := index .metadata.annotations "kubetune.dev/simulate-waiting-since" }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
""" + _container_statuses("false", """\
waiting:
  reason: {{ $reason | Quote }}
  message: {{ printf "simulated %s for image %s" $reason .image | Quote }}
""") + """\
phase: Pending
startTime: {{ or $since $now | Quote }}
"""


class _TemplateDumper(yaml.SafeDumper):
    """Writes multi-line strings (the templates) as ``|`` blocks, readable in kwok.yaml."""


_TemplateDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))

STAGES = yaml.dump_all([
    _stage("node-initialize", "Node", [_NOT_READY], {"statusTemplate": _NODE_READY}),
    _stage("pod-ready", "Pod", [*_pod_in_phase("Pending"), _NOT_READY,
                                _expression(f'.metadata.annotations["{WAITING_ANNOTATION}"]', "DoesNotExist")],
           {"statusTemplate": _POD_RUNNING}),
    _stage("pod-waiting", "Pod", [*_pod_in_phase("Pending"), _expression(".status.containerStatuses", "DoesNotExist"),
                                  _expression(f'.metadata.annotations["{WAITING_ANNOTATION}"]', "Exists")],
           {"statusTemplate": _POD_WAITING}),
    _stage("pod-exit", "Pod", [*_pod_in_phase("Running"),
                               _expression(f'.metadata.annotations["{EXIT_ANNOTATION}"]', "Exists")],
           {"statusTemplate": _POD_EXITED}),
    _stage("pod-delete", "Pod", [_expression(".metadata.deletionTimestamp", "Exists")], {"delete": True}),
], Dumper=_TemplateDumper, sort_keys=False)


class FakeNodes(processes.HostProcess):
    """A kwok process managing the nodes labelled ``type=kwok`` of a control plane."""

    name = "kwok"
    log_name = "kwok.log"

    def start(self) -> "FakeNodes":
        binary = ensure_kwok(self.log)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "kwok.yaml"
        config.write_text(STAGES)
        from kubernetes import config as kube_config
        with kube_config.new_client_from_config(config_file=str(self.kubeconfig)) as api:
            install_logs_crd(api)
        kubelet_port = processes.free_port()
        self._spawn([
            str(binary), f"--kubeconfig={self.kubeconfig}", f"--config={config}",
            f"--manage-nodes-with-label-selector={NODE_LABEL}={NODE_LABEL_VALUE}",
            # kwok's kubelet endpoint (container logs, kwok_logs.py), where the kube-apiserver
            # looks for it: the nodes' InternalIP and kubelet port
            "--cidr=10.244.0.0/16", "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{kubelet_port}", f"--node-port={kubelet_port}", "--enable-crds=Logs",
        ])
        return self

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

        def ready() -> bool:
            node = core.read_node(name)
            conditions = {c.type: c.status for c in node.status.conditions or []}
            return conditions.get("Ready") == "True" and bool(node.status.allocatable)
        self.wait_until(time.monotonic() + timeout, ready, f"fake node {name} Ready", interval=0.1)
