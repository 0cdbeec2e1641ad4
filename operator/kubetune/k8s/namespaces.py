"""The Namespace reads of the pod executor: a namespace's labels opt it in to pod
allowances (spec/pod_policy.py)."""
from __future__ import annotations

from typing import Any


def namespace_labels(core: Any, name: str) -> dict[str, str]:
    """The labels of Namespace ``name``; with watchNamespaces the chart's Role in that
    namespace grants ``get`` on this one Namespace object, nothing cluster-wide."""
    return dict(core.read_namespace(name).metadata.labels or {})
