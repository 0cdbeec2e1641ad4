"""What a Kubernetes cluster can hold for pod trials: each schedulable node's allocatable
CPU, memory and GPUs, minus what the pods bound to it request (pure: the pod executor
reads the nodes and pods)."""
from __future__ import annotations

from typing import Any, Mapping

from kubetune.executors.base import ClusterResources, NodeResources
from kubetune.executors.pods import spec as pod_spec


def cluster_resources(nodes: list[Mapping[str, Any]], pods: list[Mapping[str, Any]]) -> ClusterResources:
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            for container in pod["spec"].get("containers") or []:
                for name, amount in ((container.get("resources") or {}).get("requests") or {}).items():
                    kind = _kind(name)
                    used.setdefault(node, {})[kind] = used.get(node, {}).get(kind, 0.0) + _parse_quantity(amount)
    listed, total, available = [], {}, {}
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        name = node["metadata"]["name"]
        capacity = {_kind(k): _parse_quantity(v)
                    for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()
                    if _kind(k) in ("CPU", "GPU", "memory")}
        free = {k: max(0.0, v - used.get(name, {}).get(k, 0.0)) for k, v in capacity.items()}
        listed.append(NodeResources(name, name, capacity, free))
        for k, v in capacity.items():
            total[k] = total.get(k, 0.0) + v
            available[k] = available.get(k, 0.0) + free[k]
    return ClusterResources(total, available, listed)


def _kind(name: str) -> str:
    return {"cpu": "CPU", "memory": "memory", pod_spec.GPU_RESOURCE: "GPU"}.get(name, name)


_SUFFIXES = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60,
             "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def _parse_quantity(text: Any) -> float:
    text = str(text)
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * _SUFFIXES[suffix]
    return float(text)
