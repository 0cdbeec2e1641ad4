"""Every private name of Ray the Ray platform uses, in one place (the trial side's one,
``ray.train._internal.session``, is trainable/ray_private.py's).

Ray's public API cannot give a node's free resources, a GCS client that never blocks the
driver, a reload of Ray's settings from the environment, or the autoscaling config KubeRay
derives from a RayCluster; these come from Ray's private modules, here only.  tests/unit/test_ray_compat.py checks each name and
signature against the installed Ray, so an upgrade that moves one fails there, by name.
pyproject.toml pins ``ray>=2.60,<2.61``.

The KubeRay names are imported by a function Ray runs on the head node, shipped by value
without kubetune (executors/ray/autoscaler.py): it imports them itself, by the module
and attribute names listed here (``KUBERAY_AUTOSCALING_CONFIG``), which the test checks."""
from __future__ import annotations

from typing import Any

# executors/ray/autoscaler.py's _head_autoscaling_config, run on the head node
KUBERAY_AUTOSCALING_CONFIG = ("ray.autoscaler._private.kuberay.autoscaling_config",
                              "_derive_autoscaling_config_from_ray_cr")
KUBERAY_API_CLIENT = ("ray.autoscaler._private.kuberay.node_provider", "KubernetesHttpApiClient")
# gRPC's error from the GCS client, told apart by its name (executors/ray/errors.py): its
# class moves between Ray's private modules
RPC_ERROR_NAMES = frozenset({"RpcError"})


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """{node id: its free resources}; raises through Ray Client, which does not offer it."""
    from ray._private.state import available_resources_per_node as per_node
    return per_node()


def stored_object(ref: Any) -> tuple[Any, bytes]:
    """The raw (data, metadata) Ray's core worker holds for a finished object ``ref``,
    read without deserializing it (executors/ray/answers.py never unpickles)."""
    from ray._private.worker import global_worker
    serialized = global_worker.core_worker.get_objects([ref], 0)[0]
    return serialized[0], bytes(serialized[1] or b"")


def error_info(data: Any, code: bytes) -> Any:
    """The ``ErrorInfo`` protobuf of a Ray system error's raw data (msgpack + protobuf)."""
    from ray._private.worker import global_worker
    return global_worker.get_serialization_context()._deserialize_error_info(data, [code])


def gcs_client(address: str) -> Any:
    """A GCS client of its own (never the driver's blocking one), whose
    ``internal_kv_get(key, namespace, timeout=)`` reads the cluster's session name
    (executors/ray/liveness.py)."""
    from ray._raylet import GcsClient
    return GcsClient(address=address)


def reload_settings_from_environment() -> None:
    """Have this process's Ray read its ``RAY_<setting>`` environment variables again.
    Ray reads them once, into a process-wide config, when it is imported, and again only
    when ``ray.init`` starts the core worker: a GCS client made in between (the one Ray's
    internal KV uses) keeps the values of import time.  Ray does the same itself after it
    turns token authentication on (``Config.initialize("")``)."""
    from ray._raylet import Config
    Config.initialize("")
