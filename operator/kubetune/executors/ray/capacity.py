"""What a Ray cluster offers, as the Ray executor reports it: its totals, what is free
and what each node has (``cluster_resources``), and the node types its autoscaler may
add (``NodeTypes``)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Mapping

import ray

from kubetune.core.resources import Resources
from kubetune.executors.base import ClusterResources, NodeResources
from kubetune.executors.ray import ray_compat
from kubetune.executors.ray.autoscaler import read_node_types
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.executors.ray.pool import Worker

log = logging.getLogger(__name__)

NODE_TYPES_REFRESH_S = 300.0   # an autoscaling config changes rarely (a `ray up` of a new one)


def read_cluster() -> tuple[dict[str, float], dict[str, float], dict[str, dict[str, float]], list[dict]]:
    """Ray's totals, what it says is available, per node, and its live nodes; raises what
    Ray raises when it cannot be asked."""
    total = _public(ray.cluster_resources())
    available = _public(ray.available_resources())
    per_node = {}
    try:
        per_node = {k: _public(v) for k, v in ray_compat.available_resources_per_node().items()}
    except Exception:  # noqa: BLE001 - not offered through Ray Client
        pass
    return total, available, per_node, [n for n in ray.nodes() if n.get("Alive")]


def cluster_resources(seen: tuple[dict[str, float], dict[str, float], dict[str, dict[str, float]], list[dict]],
                      idle_workers: Iterable[Worker]) -> ClusterResources:
    """What ``read_cluster`` saw, with what idle pooled workers hold counted as free (one
    is ended at once when a new actor needs its room)."""
    total, available, per_node, nodes_info = seen
    for worker in idle_workers:
        for k, v in worker.shape.bundle().items():
            available[k] = available.get(k, 0.0) + v
            if worker.node_id in per_node:
                per_node[worker.node_id][k] = per_node[worker.node_id].get(k, 0.0) + v
    nodes = [NodeResources(n["NodeID"], n.get("NodeManagerAddress", ""),
                           _public(n.get("Resources", {})), per_node.get(n["NodeID"], {}))
             for n in nodes_info]
    return ClusterResources(total, available, nodes)


class NodeTypes:
    """The largest shape of each node type the Ray autoscaler may add, for one connection.

    Read from the autoscaler's config on the head node once, and again every
    ``NODE_TYPES_REFRESH_S`` in a thread of its own while the last answer is returned (a
    read runs a task on the head: seconds on a loaded machine, which a reconcile cycle,
    or a failover, would otherwise wait for); a failed re-read keeps the last answer, a
    failed first read raises ``RayUnavailableError`` (unknown must not pass for "cannot
    grow": every GPU trial on a head without GPUs would fail as infeasible)."""

    def __init__(self, address: str, rpc_timeout_s: float) -> None:
        self.address = address
        self.rpc_timeout_s = rpc_timeout_s
        self._lock = threading.Lock()
        self._known: tuple[float, list[Resources] | None] | None = None   # (read at, shapes)
        self._reading = False     # a re-read is under way in a thread
        self._first_read = threading.Lock()   # one first read at a time: the others take its answer

    def get(self) -> list[Resources] | None:
        """The shapes (``core.resources.Resources``), or None when the cluster cannot grow."""
        with self._lock:
            known = self._known
            stale = known is not None and time.monotonic() - known[0] >= NODE_TYPES_REFRESH_S
            if stale and not self._reading:
                self._reading = True
                threading.Thread(target=self._read, args=(known,), daemon=True, name="ray-node-types").start()
        if known is not None:
            return known[1]
        with self._first_read:    # a standby's read ahead and the leader's: one task on the head
            if self._known is not None:
                return self._known[1]
            return self._read(None)

    def _read(self, known: tuple[float, list[Resources] | None] | None) -> list[Resources] | None:
        try:
            shapes = read_node_types(timeout_s=3 * self.rpc_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure: the head did not tell
            if known is not None:
                log.warning("cannot re-read the autoscaler's node types: %s: %s", type(exc).__name__, exc)
                with self._lock:
                    self._known, self._reading = (time.monotonic(), known[1]), False
                return known[1]
            raise RayUnavailableError(self.address, "cannot read the autoscaler's node types from the "
                                      f"head node: {type(exc).__name__}: {exc}") from exc
        types = [Resources.from_ray(shape) for shape in shapes] if shapes is not None else None
        with self._lock:
            self._known, self._reading = (time.monotonic(), types), False
        return types


def _public(resources: Mapping[str, float]) -> dict[str, float]:
    """Drop Ray's internal per-node marker resources (``node:<ip>``)."""
    return {k: float(v) for k, v in resources.items() if not k.startswith("node:")}
