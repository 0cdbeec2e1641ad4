"""What the Ray autoscaler could add: the node types of the cluster's autoscaling config.

Ray keeps the autoscaler's config to itself: neither the GCS (``ray.nodes()``, the
cluster resource state, the autoscaler's status in the internal KV) nor
``ray.autoscaler.v2.sdk.get_cluster_status`` names the node types a cluster may grow
by, only the nodes it has.  The config is found from the head node, so a zero-CPU
task pinned there (``_head_autoscaling_config``) reads it where the autoscaler does:

- ``ray start --head --autoscaling-config=FILE`` (and ``ray up``): the file named on
  the command line of the autoscaler process (``monitor.py``) serving this GCS;
- KubeRay (the autoscaler runs in a sidecar the head cannot see): the RayCluster
  named by ``RAY_CLUSTER_NAME``, fetched with the head pod's service account (the
  one KubeRay's autoscaler uses) and turned into a config by Ray's own KubeRay code.

No autoscaler (an autoscaler without a config is Ray's read-only one, on a fixed-size
cluster; a RayCluster without ``enableInTreeAutoscaling``) means the cluster cannot
grow: None.
"""
from __future__ import annotations

import types
from typing import Any

import ray

# Ray's per-node marker resource of the head node: a task asking for a sliver of it runs there
HEAD_NODE_RESOURCE = "node:__internal_head__"


def _head_autoscaling_config() -> dict[str, Any] | None:
    """Runs on the head node: the autoscaling config of this cluster, {} when there is
    an autoscaler without one, None when none is found.  Self-contained (imports
    inside, no module globals): Ray ships it by value, so the head's workers need
    nothing of kubetune."""
    import os

    import ray as ray_on_head
    import yaml

    port = ray_on_head.get_runtime_context().gcs_address.rpartition(":")[2]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if not any(a.endswith("monitor.py") and "autoscaler" in a for a in args):
            continue
        if not any(a.startswith("--gcs-address=") and a.rpartition(":")[2] == port for a in args):
            continue   # another cluster's autoscaler on this machine
        path = next((a.split("=", 1)[1] for a in args if a.startswith("--autoscaling-config=")), None)
        if path is None and "--autoscaling-config" in args[:-1]:
            path = args[args.index("--autoscaling-config") + 1]
        if not path:
            return {}
        path = os.path.expanduser(path)
        if not os.path.isabs(path):
            path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
        with open(path) as f:
            return yaml.safe_load(f) or {}

    name = os.environ.get("RAY_CLUSTER_NAME")     # set by KubeRay in every Ray pod
    if not name:
        return None
    namespace = os.environ.get("RAY_CLUSTER_NAMESPACE")
    if not namespace:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            namespace = f.read().strip()
    # Ray's private names (executors/ray/ray_compat.py lists them; this runs on the head without kubetune)
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr
    from ray.autoscaler._private.kuberay.node_provider import KubernetesHttpApiClient
    ray_cluster = KubernetesHttpApiClient(namespace=namespace).get(f"rayclusters/{name}")
    if not ray_cluster.get("spec", {}).get("enableInTreeAutoscaling"):
        return {}
    return _derive_autoscaling_config_from_ray_cr(ray_cluster)


def node_type_shapes(config: dict[str, Any] | None) -> list[dict[str, float]] | None:
    """The resources of each worker node type the autoscaler may launch (``max_workers``
    > 0), from an autoscaling config; None if it launches none."""
    if not config or config.get("max_workers", 1) == 0:
        return None
    head_type = config.get("head_node_type")
    shapes = []
    for name, node_type in (config.get("available_node_types") or {}).items():
        if name == head_type or node_type.get("max_workers", config.get("max_workers", 1)) == 0:
            continue
        shapes.append({k: float(v) for k, v in (node_type.get("resources") or {}).items()})
    return shapes or None


def read_node_types(timeout_s: float) -> list[dict[str, float]] | None:
    """Node type shapes of the connected cluster's autoscaler (Ray resource dicts), or
    None when it cannot grow.  Raises (a Ray error, GetTimeoutError) when the head does
    not answer: "unknown" must not be mistaken for "cannot grow"."""
    task = ray.remote(num_cpus=0, resources={HEAD_NODE_RESOURCE: 0.001}, max_retries=0)(
        _shipped_by_value(_head_autoscaling_config))
    ref = task.remote()
    try:
        config = ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)     # do not leave it queued on the head
        raise
    return node_type_shapes(config)


def _head_request_resources(bundles: list[dict[str, float]]) -> None:
    """Runs on the head node: the autoscaler request made there.  Self-contained."""
    from ray.autoscaler.sdk import request_resources
    request_resources(bundles=bundles)


def request_resources(bundles: list[dict[str, float]], timeout_s: float) -> None:
    """Ask the connected cluster's autoscaler for ``bundles`` (replacing the previous
    request).  Ray writes the request into the GCS's key-value store, which a Ray Client
    (``ray://``) driver cannot reach ("GCS client is not available"): through Ray Client
    a zero-CPU task on the head makes it there."""
    if not ray.util.client.ray.is_connected():
        from ray.autoscaler.sdk import request_resources as request_here
        request_here(bundles=bundles)
        return
    task = ray.remote(num_cpus=0, resources={HEAD_NODE_RESOURCE: 0.001}, max_retries=0)(
        _shipped_by_value(_head_request_resources))
    ref = task.remote(bundles)
    try:
        ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref, force=True)
        raise


def _shipped_by_value(function: types.FunctionType) -> types.FunctionType:
    """A copy of a self-contained ``function`` that Ray pickles by value, as it does a
    script's functions; by reference, the head's worker would import kubetune."""
    copy = types.FunctionType(function.__code__, {"__builtins__": __builtins__}, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__module__ = "__main__"
    copy.__qualname__ = function.__qualname__
    return copy
