"""The Ray actors that host trials: their names, their creation, and the pool of idle
workers that host the next trial of the same shape (see executors/ray/executor.py).

Each Experiment's actors live in a Ray namespace of their own, chosen by the
operator (``experiment_namespace``: ``<base>/<ns>/<experiment>``), under names the
operator assigns; the executor looks for an experiment's actors there only.  Ray
namespaces are no access control (any driver or actor of the cluster may name any
namespace): they keep experiments apart, not tenants (README: Security).

A pooled worker is keyed by experiment + resource shape + runtime_env; it waits in
the pool after its trial ends and is killed after ``idle_ttl_s``, or at once when a
new worker of another shape needs what it holds.  So that the next trial of its
experiment gets it, the ended trial's room in the ledger passes to that trial out of
turn, up to ``platform.WARM_PASSES`` (3) times in a row (core/warm_room.py): an
Experiment runs up to 1 + 3 trials per turn in line, 3 of them warm, and the first in
line waits for at most 3 short trials per slot.  A dedicated actor (multi-bundle
trials, or ``reuse_actors=False``) is named after its trial and killed when it ends.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from kubetune.executors.base import LaunchRequest
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.spec.model import TrialResources
from kubetune.spec.trial_key import TrialKey
# the actor class lives in a light module: every worker process imports it on start
from kubetune.executors.ray.answers import HostActor as _HostActor

ACTOR_PREFIX = "kubetune/"
WORKER_MARK = "#w-"        # never part of a Kubernetes name, so never a trial's
PG_MARK = "#pg-"
ACTOR_THREADS = 16         # fetch/stop/describe are served while the function runs


def actor_name(trial_key: str) -> str:
    return ACTOR_PREFIX + trial_key


def experiment_prefix(trial_key: str) -> str:
    """``"<ns>/<experiment>/"`` of a trial key."""
    return TrialKey.parse(trial_key).experiment_prefix


def experiment_namespace(base: str, prefix: str) -> str:
    """The Ray namespace of the actors under ``"<ns>/<experiment>/"`` (or a trial key)."""
    parts = prefix.split("/")
    return f"{base}/{parts[0]}/{parts[1]}"


def namespace_of_actor(base: str, name: str) -> str:
    """The Ray namespace of one of our actors, from its name ``kubetune/<ns>/<exp>/...``."""
    return experiment_namespace(base, name[len(ACTOR_PREFIX):])


@dataclass
class Worker:
    name: str
    handle: Any
    shape: TrialResources
    pool_key: str = ""                  # "" for a dedicated actor
    node_id: str | None = None
    placement_group: str | None = None
    idle_since: float = 0.0
    namespace: str = ""                 # its Ray namespace (experiment_namespace)


def _kill_actor(handle: Any) -> None:
    ray.kill(handle, no_restart=True)


class WorkerPool:
    """Creates trial actors and keeps the idle pooled ones.  ``lock`` is the executor's.

    No Ray call is made holding ``lock``: the lock guards only our bookkeeping (which
    workers are idle), and a Ray call may hang for as long as the cluster's head is gone
    (outage.py gives up waiting for it, but cannot take the lock back from its thread),
    which would hold every other call on this executor (poll, stop, discovery) with it.
    So a worker is taken out of the pool under the lock, then killed outside it.
    ``kill_actor``: how an actor is ended (``ray.kill``; tests pass their own)."""

    def __init__(self, lock: threading.RLock, *, address: str, namespace: str, reuse_actors: bool,
                 idle_ttl_s: float, orphan_timeout_s: float, rpc_timeout_s: float,
                 lease_timeout_s: float = 0.0, kill_actor: Callable[[Any], None] = _kill_actor,
                 on_kill: Callable[[str], None] = lambda name: None):
        self._lock = lock
        self._kill_actor = kill_actor
        self._on_kill = on_kill     # told each actor name it ends (named_actors.NamedActors.killed)
        self.address = address
        self.namespace = namespace
        self.reuse_actors = reuse_actors
        self.idle_ttl_s = idle_ttl_s
        self.orphan_timeout_s = orphan_timeout_s
        self.lease_timeout_s = lease_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self._idle: dict[str, list[Worker]] = {}

    def pooled(self, shape: TrialResources) -> bool:
        return self.reuse_actors and shape.bundles == 1

    @staticmethod
    def pool_key(req: LaunchRequest, shape: TrialResources) -> str:
        fingerprint = json.dumps([shape.bundle(), req.runtime_env], sort_keys=True, default=str)
        digest = hashlib.sha1(fingerprint.encode()).hexdigest()[:10]
        return experiment_prefix(req.trial_key) + digest

    def idle_workers(self) -> list[Worker]:
        with self._lock:
            return [w for ws in self._idle.values() for w in ws]

    def take_idle(self, pool_key: str) -> Worker | None:
        self.reap_idle()
        with self._lock:
            workers = self._idle.get(pool_key)
            return workers.pop() if workers else None

    def give_back(self, worker: Worker, busy: list[TrialResources] = ()) -> None:
        """A pooled worker whose trial ended waits for the next one, unless what our
        actors hold (``busy``: running trials and actors being created) and the idle ones
        would then exceed the cluster: the ledger may have granted its resources to a
        trial whose new actor Ray holds back meanwhile, so the oldest idle workers go
        (this one included, if it is the only one)."""
        worker.idle_since = time.monotonic()
        with self._lock:
            self._idle.setdefault(worker.pool_key, []).append(worker)
            idle = sorted((w for ws in self._idle.values() for w in ws), key=lambda w: w.idle_since)
        total = ray.cluster_resources()
        held = _summed([s.total() for s in busy] + [w.shape.total() for w in idle])
        for victim in idle:
            if all(held.get(k, 0.0) <= v + 1e-9 for k, v in total.items()):
                return
            if not self._withdraw(victim):
                continue
            self.kill(victim)
            for k, v in victim.shape.total().items():
                held[k] = held.get(k, 0.0) - v

    def _withdraw(self, worker: Worker) -> bool:
        """Take an idle worker out of the pool to end it; False if another thread took it."""
        with self._lock:
            workers = self._idle.get(worker.pool_key, [])
            if worker not in workers:
                return False
            workers.remove(worker)
            if not workers:
                del self._idle[worker.pool_key]
            return True

    def forget(self, prefix: str) -> None:
        """Drop the idle workers under a trial-key prefix (their actors were killed)."""
        with self._lock:
            for pool_key in [k for k in self._idle if k.startswith(prefix)]:
                del self._idle[pool_key]

    def reap_idle(self) -> None:
        """Kill the workers idle for longer than ``idle_ttl_s``: chosen (and taken out of
        the pool) under the lock, killed outside it.  Call it without holding the lock."""
        deadline = time.monotonic() - self.idle_ttl_s
        with self._lock:
            expired = []
            for pool_key, workers in list(self._idle.items()):
                expired += [w for w in workers if w.idle_since < deadline]
                workers[:] = [w for w in workers if w.idle_since >= deadline]
                if not workers:
                    del self._idle[pool_key]
        for worker in expired:
            self.kill(worker)

    def create(self, req: LaunchRequest, shape: TrialResources, launch: dict,
               busy: list[TrialResources] = ()) -> Worker:
        """A new actor for the trial; ``busy``: the shapes of the actors running trials now."""
        pooled = self.pooled(shape)
        if pooled:
            pool_key = self.pool_key(req, shape)
            name = f"{ACTOR_PREFIX}{pool_key.rsplit('/', 1)[0]}/{WORKER_MARK}" \
                   f"{pool_key.rsplit('/', 1)[1]}-{uuid.uuid4().hex[:8]}"
        else:
            pool_key, name = "", actor_name(req.trial_key)
            self._free_name(name)
        self._evict_idle_for(shape, keep=pool_key, busy=list(busy))
        namespace = experiment_namespace(self.namespace, req.trial_key)
        options: dict[str, Any] = {
            "name": name, "namespace": namespace, "lifetime": "detached",
            "max_concurrency": ACTOR_THREADS, "max_restarts": 0,
            "num_cpus": shape.cpu, "num_gpus": shape.gpu,
        }
        if shape.memory_bytes:
            options["memory"] = shape.memory_bytes
        if shape.custom:
            options["resources"] = dict(shape.custom)
        if req.runtime_env:
            options["runtime_env"] = dict(req.runtime_env)
        pg_name = None
        if shape.bundles > 1:
            pg_name = f"{name}{PG_MARK}a{req.attempt}-{uuid.uuid4().hex[:6]}"
            group = ray.util.placement_group([shape.bundle()] * shape.bundles, strategy="PACK",
                                             name=pg_name, lifetime="detached")
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=0,
                placement_group_capture_child_tasks=True)
        shape_info = {"cpu": shape.cpu, "gpu": shape.gpu, "memory": shape.memory,
                      "custom": dict(shape.custom), "bundles": shape.bundles, "pg": pg_name}
        handle = _HostActor.options(**options).remote(
            name, pool_key, shape_info, launch, idle_timeout_s=3 * self.idle_ttl_s,
            orphan_timeout_s=self.orphan_timeout_s, lease_timeout_s=self.lease_timeout_s)
        return Worker(name, handle, shape, pool_key, placement_group=pg_name, namespace=namespace)

    def _free_name(self, name: str) -> None:
        """A dedicated actor's name may still be held by an earlier attempt: end it."""
        namespace = namespace_of_actor(self.namespace, name)
        try:
            old = ray.get_actor(name, namespace=namespace)
        except ValueError:
            return
        ray.kill(old, no_restart=True)
        deadline = time.monotonic() + self.rpc_timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                return
            time.sleep(0.05)
        raise RayUnavailableError(self.address, f"actor {name!r} did not go away after ray.kill")

    def _evict_idle_for(self, shape: TrialResources, keep: str, busy: list[TrialResources]) -> None:
        """Kill idle workers of other pools when a new worker needs what they hold.

        The ledger counts an idle worker's resources as free (``cluster_resources``), so
        it grants them to the next trial in line, most often another Experiment's (whose
        worker cannot be reused here).  Ray still counts them as held until the idle
        worker dies: without room made here, the new actor waits in Ray's queue until
        the idle one expires (``idle_ttl_s``) while its trial counts as running, and the
        queue behind it waits too (issue 26: capacity idle, 198 trials queued).  So
        workers are killed, oldest first, until what this executor's actors hold (``busy``
        running trials, the idle workers left and the new one) fits the cluster's total.
        That is our own bookkeeping, exact and without delay; Ray's available resources,
        which lag behind actors just created, are asked as well, for actors that are
        not ours."""
        with self._lock:
            others = sorted((w for key, ws in self._idle.items() if key != keep for w in ws),
                            key=lambda w: w.idle_since)
            idle = [w for ws in self._idle.values() for w in ws]
        if not others:
            return
        total, available = ray.cluster_resources(), ray.available_resources()
        need = shape.total()
        held = _summed([s.total() for s in busy] + [need] + [w.shape.total() for w in idle])
        kinds = [k for k in need if k in total]
        for worker in others:
            ours_fit = all(held.get(k, 0.0) <= total[k] + 1e-9 for k in kinds)
            if ours_fit and all(available.get(k, 0.0) >= v for k, v in need.items()):
                return
            if not self._withdraw(worker):
                continue
            self.kill(worker)
            for k, v in worker.shape.total().items():
                available[k] = available.get(k, 0.0) + v
                held[k] = held.get(k, 0.0) - v

    def kill(self, worker: Worker) -> None:
        """End a worker's actor (and placement group): Ray calls, so never under the lock."""
        self._on_kill(worker.name)
        try:
            self._kill_actor(worker.handle)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if worker.placement_group:
            self.remove_placement_groups(worker.name)

    @staticmethod
    def remove_placement_groups(name_prefix: str) -> int:
        removed = 0
        try:
            table = ray.util.placement_group_table()
        except Exception:  # noqa: BLE001 - best effort: Ray Client may not offer it
            return 0
        for pg_id, info in table.items():
            if info.get("name", "").startswith(name_prefix + PG_MARK) \
                    and info.get("state") != "REMOVED":
                try:
                    ray.util.remove_placement_group(
                        PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
                    removed += 1
                except Exception:  # noqa: BLE001
                    pass
        return removed


def _summed(amounts: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for amount in amounts:
        for kind, value in amount.items():
            total[kind] = total.get(kind, 0.0) + value
    return total
