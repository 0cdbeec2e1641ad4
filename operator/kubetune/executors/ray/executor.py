"""Run trials as named, detached Ray actors; fetch their results in batched rounds.

Actors.  Every trial runs inside a ``TrialHost`` (trainable/host.py): a threaded,
detached Ray actor in its experiment's Ray namespace (``kubetune/<ns>/<experiment>``)
that runs the user's function in a thread and buffers its reports by sequence number.
That process runs the user's code, so nothing it returns is unpickled here: every call
is answered as JSON through Ray's key-value store and checked (answers.py, checked.py).  Detached, so a restarted
operator kills no trial; named, so it finds them again:

- dedicated: ``kubetune/<ns>/<experiment>/<trial>``, one actor per trial attempt,
  killed when the trial ends.  Used for multi-bundle trials (``bundles`` > 1: a
  placement group per attempt, PACK strategy, all-or-nothing; the actor takes
  bundle 0, the rest are reserved for the workers the function starts, which run
  inside the group by default) and whenever ``reuse_actors=False``.
- pooled (the default for single-bundle trials): ``kubetune/<ns>/<experiment>/#w-<shape>-<id>``.
  A worker runs one trial at a time; when a trial ends its worker goes back to an
  idle pool keyed by experiment + resource shape + runtime_env and hosts the next
  trial of that shape.  Starting a Ray actor costs a Python process (~0.4 s and
  ~1 s of CPU here); handing a trial to an idle worker costs one actor call
  (~1 ms).  Idle workers are killed after ``idle_ttl_s``, or at once when a new
  worker of another shape needs their resources; ``cluster_resources`` counts what
  they hold as available.  Module-level state of the user's code survives from one
  trial to the next of the same experiment, as with Ray Tune's ``reuse_actors``.

Which actor hosts which trial is asked of the actors themselves (``describe``), so
nothing needs recording on the Trial: after a restart the executor lists the named
actors of an experiment once and re-attaches by trial key.

Results.  ``poll`` fires one ``fetch(after_seq)`` per trial, then waits for all of
them together: one round trip for any number of trials; with ``wait_s`` > 0 it is a
long poll.

This module is the executor's surface; the parts live beside it: ``pool``
(actor names, creating actors, the idle pool), ``results`` (the batched fetch
rounds), ``discovery`` (re-attaching after a restart).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Mapping

import ray
from ray.exceptions import RaySystemError

from kubetune.core.resources import Resources
from kubetune.executors.base import ClusterResources, LaunchInfo, LaunchRequest, NodeResources, TrialUpdate
from kubetune.executors.ray.autoscaler import read_node_types, request_resources
from kubetune.executors.ray import answers, checked
from kubetune.executors.ray.answers import AnswerError, call, read, ready
from kubetune.executors.ray.discovery import ActorDiscovery
from kubetune.executors.ray import ray_compat
from kubetune.executors.ray.errors import RayUnavailableError, is_unavailable
from kubetune.executors.ray.liveness import ClusterWatch, prepare_driver_env
from kubetune.executors.ray.pool import ACTOR_PREFIX, WorkerPool, actor_name, experiment_prefix, namespace_of_actor
from kubetune.executors.ray.results import (Slot, fetch_results, is_dead, is_ready, mark_dead, settle_acks,
                                            to_update)
from kubetune.spec.model import TrialResources

log = logging.getLogger(__name__)

LOGS_CHARS = 1 << 20           # the tail of a trial's output the operator takes
NODE_TYPES_REFRESH_S = 300.0   # an autoscaling config changes rarely (a `ray up` of a new one)

__all__ = ["ACTOR_PREFIX", "NODE_TYPES_REFRESH_S", "RayExecutor", "actor_name"]


class RayExecutor:
    """The Ray implementation of ``executors.base.TrialExecutor``.  Thread-safe."""

    def __init__(self, address: str = "local", *, namespace: str = "kubetune",
                 num_cpus: float | None = None, num_gpus: float | None = None,
                 auth_token: str | None = None, reuse_actors: bool = True,
                 idle_ttl_s: float = 20.0, orphan_timeout_s: float = 600.0,
                 rpc_timeout_s: float = 10.0, log_to_driver: bool = False, lease_timeout_s: float = 0.0):
        self.address = address
        self.namespace = namespace
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.reuse_actors = reuse_actors
        self.idle_ttl_s = idle_ttl_s              # idle pooled workers killed after this
        self.orphan_timeout_s = orphan_timeout_s  # a finished trial nobody fetches, then exit
        self.lease_timeout_s = lease_timeout_s    # a running trial nobody calls, then stop and exit (0: never)
        self.rpc_timeout_s = rpc_timeout_s
        self._auth_token = auth_token
        self._log_to_driver = log_to_driver
        self._lock = threading.RLock()
        self._owns_ray = False
        self._connected = False
        self._watch: ClusterWatch | None = None   # notices the cluster going away (not ``local``)
        self._reset()

    def _reset(self) -> None:
        self._slots: dict[str, Slot] = {}
        self._starting: dict[str, TrialResources] = {}   # trial key -> shape of the actor being created
        self._pool = WorkerPool(self._lock, address=self.address, namespace=self.namespace,
                                reuse_actors=self.reuse_actors, idle_ttl_s=self.idle_ttl_s,
                                orphan_timeout_s=self.orphan_timeout_s, rpc_timeout_s=self.rpc_timeout_s,
                                lease_timeout_s=self.lease_timeout_s)
        self._discovery = ActorDiscovery(self._lock, self._slots, self._pool, namespace=self.namespace,
                                         rpc_timeout_s=self.rpc_timeout_s)
        self._node_types: tuple[float, list[Resources] | None] | None = None   # (read at, shapes) of this connection
        self._node_types_reading = False     # a re-read is under way in a thread

    # ---------------------------------------------------------------- connection

    def connect(self) -> None:
        """Connect to Ray (``local`` starts an embedded one).  Idempotent."""
        with self._lock:
            if self._connected and ray.is_initialized():
                return
            self._reset()   # handles from an earlier connection are worthless
            if self._auth_token:
                os.environ["RAY_AUTH_MODE"] = "token"
                os.environ["RAY_AUTH_TOKEN"] = self._auth_token
            if not ray.is_initialized():
                options: dict[str, Any] = {"namespace": self.namespace,
                                           "log_to_driver": self._log_to_driver,
                                           "logging_level": logging.WARNING}
                if self.address == "local":
                    options.update(num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                                   include_dashboard=False)
                else:
                    options["address"] = self.address
                    _probe(self.address, self.rpc_timeout_s)
                prepare_driver_env(self.address)
                try:
                    ray.init(**options)
                except Exception as exc:  # noqa: BLE001 - ray.init raises many types
                    raise RayUnavailableError(self.address, f"{type(exc).__name__}: {exc}") from exc
                self._owns_ray = True
            if self.address != "local":
                self._watch = ClusterWatch.attach(timeout_s=min(2.0, self.rpc_timeout_s))
            self._connected = True

    @staticmethod
    def is_unavailable(error: BaseException) -> bool:
        return is_unavailable(error)

    def disconnect(self) -> None:
        """Drop the connection; trials keep running (unless Ray was embedded: ``local``)."""
        with self._lock:
            if self._owns_ray and ray.is_initialized():
                ray.shutdown()
            self._owns_ray = self._connected = False
            self._watch = None
            self._reset()

    def _ensure_connected(self) -> None:
        if not (self._connected and ray.is_initialized()):
            self._connected = False
            self.connect()
        watch = self._watch
        lost = watch.check() if watch is not None else ""
        if lost:
            # Drop the connection at once: a driver whose cluster is gone must make no
            # more GCS calls (see ray_liveness); the next call connects again.
            log.warning("%s; reconnecting", lost)
            self.disconnect()
            raise RayUnavailableError(self.address, lost)

    # ---------------------------------------------------------------- start

    def start(self, req: LaunchRequest) -> LaunchInfo:
        """Launch one attempt of a trial; attach instead if that attempt already runs."""
        self._ensure_connected()
        shape = TrialResources.of(req.resources)
        prefix = experiment_prefix(req.trial_key)
        self._discovery.discover_once(prefix)
        with self._lock:
            slot = self._slots.get(req.trial_key)
            unanswered = slot is None and self._discovery.unanswered(prefix)
        if unanswered:
            # An actor of the experiment has not said yet what it hosts (a restarted operator,
            # an actor still starting): it may be this trial, which must not run twice.
            self._discovery.discover(prefix, wait_s=self.rpc_timeout_s)
            with self._lock:
                slot = self._slots.get(req.trial_key)
        if slot is not None:
            if slot.attempt in (req.attempt, None) and not is_dead(slot):
                return LaunchInfo(req.trial_key, slot.worker.name, attached=True,
                                  placement_group=slot.worker.placement_group)
            self.stop(req.trial_key)    # a previous attempt is still held: end it first
        launch = req.as_dict()
        worker = self._pool.take_idle(self._pool.pool_key(req, shape)) \
            if self._pool.pooled(shape) else None
        if worker is not None:
            ack = call(worker.handle.assign, worker.namespace, launch)
        else:
            with self._lock:   # what our actors hold, those other threads are creating included
                busy = self._busy()
                self._starting[req.trial_key] = shape
            try:
                worker = self._pool.create(req, shape, launch, busy)
                ack = call(worker.handle.describe, worker.namespace)
            except BaseException:
                with self._lock:
                    self._starting.pop(req.trial_key, None)
                raise
        if req.checkpoint and f"/{req.trial_key}/" not in req.checkpoint:
            # Another trial's checkpoint (PBT): the trial copies it as it starts; wait for
            # that, since its owner keeps it only until the operator fetches a newer one.
            ready([ack], self.rpc_timeout_s)
        with self._lock:
            self._slots[req.trial_key] = Slot(worker, req.attempt, ack=ack)
            self._starting.pop(req.trial_key, None)
        return LaunchInfo(req.trial_key, worker.name, attached=False,
                          placement_group=worker.placement_group)

    def _busy(self) -> list[TrialResources]:
        """The shapes of our actors that run trials or are being created (under the lock)."""
        return [slot.worker.shape for slot in self._slots.values() if not is_dead(slot)] + list(self._starting.values())

    # ---------------------------------------------------------------- poll

    def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0,
             limit: int = 1000) -> dict[str, TrialUpdate]:
        """New results and state of each trial in ``cursors`` (trial key -> last seq seen).

        One batched round: every actor call is fired first, then all are awaited
        together (at most ``rpc_timeout_s``, plus ``wait_s`` for a long poll).  A
        trial whose actor is slow to answer shows as running with no new results.
        Raises ``RayUnavailableError`` only when Ray itself cannot be reached.
        """
        self._ensure_connected()
        try:
            return self._poll(cursors, wait_s, limit)
        except (RaySystemError, ConnectionError) as exc:
            self.disconnect()    # connect afresh next time (Ray Client has no ClusterWatch)
            raise RayUnavailableError(self.address, f"{type(exc).__name__}: {exc}") from exc

    def _poll(self, cursors: Mapping[str, int], wait_s: float,
              limit: int) -> dict[str, TrialUpdate]:
        updates: dict[str, TrialUpdate] = {}
        with self._lock:
            unknown = [key for key in cursors if key not in self._slots]
        self._discovery.find_unknown(unknown)
        with self._lock:
            slots = {key: self._slots.get(key) for key in cursors}
            self._pool.reap_idle()
        for key, slot in slots.items():
            if slot is None:
                updates[key] = self._discovery.unknown_update(key)
        known = {key: slot for key, slot in slots.items() if slot is not None}
        settle_acks({key: slot for key, slot in known.items() if slot.ack is not None}, updates)
        fetch_results(known, cursors, updates, wait_s=wait_s, limit=limit, rpc_timeout_s=self.rpc_timeout_s)
        return {key: updates[key] for key in cursors}

    # ---------------------------------------------------------------- stop / pause

    def stop(self, trial_key: str, *, after_seq: int | None = None,
             timeout_s: float = 5.0) -> TrialUpdate | None:
        """End the trial and free what it holds.  Never raises.

        Asks the function to stop at its next report and waits up to ``timeout_s``;
        if it does not get there, its actor is killed.  Results reported after the
        stop decision are dropped unless ``after_seq`` is given: then the final
        update carries every result after it (a trial's last result is recorded
        before it is stopped).  A finished trial's worker goes back to the pool.
        Returns the final update when the trial's actor answered, else None.
        """
        return self._end(trial_key, after_seq, timeout_s, at_checkpoint=False)

    def pause(self, trial_key: str, *, after_seq: int | None = None,
              timeout_s: float = 30.0) -> TrialUpdate | None:
        """Stop the trial at its next report that carries a checkpoint.  Never raises.

        Until then ``get_context().should_checkpoint`` is True inside the function.
        Returns the final update: ``checkpoint`` is the latest persisted one, to
        resume from; with ``after_seq``, ``results`` holds every result after it
        (including the one that carried that checkpoint).  After ``timeout_s`` without a
        checkpointing report the actor is killed and ``checkpoint`` is the latest
        one saved before, which may be older than the last results.
        """
        return self._end(trial_key, after_seq, timeout_s, at_checkpoint=True)

    def _end(self, key: str, after_seq: int | None, timeout_s: float,
             at_checkpoint: bool) -> TrialUpdate | None:
        try:
            self._ensure_connected()
            with self._lock:
                slot = self._slots.get(key)
            if slot is None:
                self._discovery.find_unknown([key])
                with self._lock:
                    slot = self._slots.get(key)
            if slot is None:
                self._pool.remove_placement_groups(actor_name(key))
                return None
            update, ended = self._stop_slot(key, slot, after_seq, timeout_s, at_checkpoint)
            with self._lock:
                self._slots.pop(key, None)
                busy = self._busy()
            worker = slot.worker
            if ended and worker.pool_key:
                self._pool.give_back(worker, busy)
            else:
                self._pool.kill(worker)
            return update
        except Exception:  # noqa: BLE001 - stop must never raise
            log.exception("stopping trial %s", key)
            return None

    def _stop_slot(self, key: str, slot: Slot, after_seq: int | None, timeout_s: float,
                   at_checkpoint: bool) -> tuple[TrialUpdate | None, bool]:
        if is_dead(slot) or slot.ack is not None and not is_ready(slot.ack):
            return slot.final, False
        if slot.final is not None and after_seq is None:
            # done already: nothing to wait for but the answer whether its worker is reusable
            pending = call(slot.worker.handle.release, slot.worker.namespace, key)
            try:
                if not ready([pending], self.rpc_timeout_s):
                    return slot.final, False
                answer = {"retire": checked.names(read(pending).get("retire"), "retire")}
            except Exception:  # noqa: BLE001 - no (valid) answer: the worker is killed, not pooled
                return slot.final, False
            return slot.final, not _retired(key, slot, answer)
        pending = call(slot.worker.handle.stop, slot.worker.namespace, key, timeout_s, after_seq, at_checkpoint)
        try:
            if not ready([pending], timeout_s + self.rpc_timeout_s):
                raise AnswerError("died", "no answer in time")
            batch = checked.batch(read(pending), key, limit=1 << 30)
        except Exception as exc:  # noqa: BLE001 - the actor is killed below
            log.info("trial %s did not stop gracefully: %s", key, exc)
            if isinstance(exc, AnswerError) and exc.kind == "rejected":
                return mark_dead(key, slot, exc), False
            return None, False
        update = to_update(key, batch, batch["last_seq"] if after_seq is None else after_seq)
        return update, batch["ended"] and not _retired(key, slot, batch)

    # ---------------------------------------------------------------- listing, cleanup

    def list_trials(self, prefix: str = "") -> list[str]:
        """Trials hosted by live actors whose key starts with ``prefix`` (re-attach, cleanup)."""
        self._ensure_connected()
        for experiment in sorted({"/".join(name.split("/")[:2]) + "/"
                                  for name in self._discovery.actor_names("")}):
            if experiment.startswith(prefix) or prefix.startswith(experiment):
                self._discovery.discover(experiment, wait_s=self._discovery.first_wait_s)
        with self._lock:
            return sorted(key for key, slot in self._slots.items()
                          if key.startswith(prefix) and not is_dead(slot))

    def stop_all(self, prefix: str) -> int:
        """Kill every actor (trials and idle workers) whose trial key starts with ``prefix``.

        For a deleted experiment: ``stop_all("<ns>/<experiment>/")``.  Returns how many
        actors were killed.  Never raises.
        """
        try:
            self._ensure_connected()
            names = [ACTOR_PREFIX + name for name in self._discovery.actor_names(prefix)]
            for name in names:
                try:
                    ray.kill(ray.get_actor(name, namespace=namespace_of_actor(self.namespace, name)),
                             no_restart=True)
                except ValueError:
                    pass
            for namespace in {namespace_of_actor(self.namespace, name) for name in names}:
                answers.forget(namespace)
            with self._lock:
                for key in [k for k in self._slots if k.startswith(prefix)]:
                    del self._slots[key]
                self._pool.forget(prefix)
                self._discovery.forget(prefix)
            self._pool.remove_placement_groups(ACTOR_PREFIX + prefix)
            return len(names)
        except Exception:  # noqa: BLE001
            log.exception("stopping all trials under %s", prefix)
            return 0

    def remaining(self, prefix: str) -> int:
        """How many actors under ``prefix`` are still alive (raises if Ray cannot tell)."""
        self._ensure_connected()
        return len(self._discovery.actor_names(prefix))

    # ---------------------------------------------------------------- resources, logs

    def cluster_resources(self) -> ClusterResources:
        """Totals, what is free (idle pooled workers count as free), and per node."""
        self._ensure_connected()
        try:
            total = _public(ray.cluster_resources())
            available = _public(ray.available_resources())
            per_node = {}
            try:
                per_node = {k: _public(v) for k, v in ray_compat.available_resources_per_node().items()}
            except Exception:  # noqa: BLE001 - not offered through Ray Client
                pass
            nodes_info = [n for n in ray.nodes() if n.get("Alive")]
        except Exception as exc:  # noqa: BLE001
            self.disconnect()    # connect afresh next time (Ray Client has no ClusterWatch)
            raise RayUnavailableError(self.address, f"{type(exc).__name__}: {exc}") from exc
        for worker in self._pool.idle_workers():
            for k, v in worker.shape.bundle().items():
                available[k] = available.get(k, 0.0) + v
                if worker.node_id in per_node:
                    per_node[worker.node_id][k] = per_node[worker.node_id].get(k, 0.0) + v
        nodes = [NodeResources(n["NodeID"], n.get("NodeManagerAddress", ""),
                               _public(n.get("Resources", {})), per_node.get(n["NodeID"], {}))
                 for n in nodes_info]
        return ClusterResources(total, available, nodes)

    def node_types(self) -> list[Resources] | None:
        """The largest shape of each node type the Ray autoscaler may add (a list of
        ``core.resources.Resources``), or None when the cluster cannot grow.  Read from
        the autoscaler's config on the head node once per connection, and again every
        ``NODE_TYPES_REFRESH_S`` in a thread of its own while the last answer is
        returned (a read runs a task on the head: seconds on a loaded machine, which a
        reconcile cycle, or a failover, would otherwise wait for); a failed re-read keeps
        the last answer, a failed first read raises ``RayUnavailableError`` (unknown must
        not pass for "cannot grow": every GPU trial on a head without GPUs would fail as
        infeasible)."""
        if self.address == "local":
            return None      # an embedded cluster is this process's machine
        self._ensure_connected()
        with self._lock:
            known = self._node_types
            stale = known is not None and time.monotonic() - known[0] >= NODE_TYPES_REFRESH_S
            if stale and not self._node_types_reading:
                self._node_types_reading = True
                threading.Thread(target=self._read_node_types, args=(known,), daemon=True,
                                 name="ray-node-types").start()
        if known is not None:
            return known[1]
        return self._read_node_types(None)

    def _read_node_types(self, known: tuple[float, list[Resources] | None] | None) -> list[Resources] | None:
        try:
            shapes = read_node_types(timeout_s=3 * self.rpc_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure: the head did not tell
            if known is not None:
                log.warning("cannot re-read the autoscaler's node types: %s: %s", type(exc).__name__, exc)
                with self._lock:
                    self._node_types, self._node_types_reading = (time.monotonic(), known[1]), False
                return known[1]
            raise RayUnavailableError(self.address, "cannot read the autoscaler's node types from the "
                                      f"head node: {type(exc).__name__}: {exc}") from exc
        types = [Resources.from_ray(shape) for shape in shapes] if shapes is not None else None
        with self._lock:
            self._node_types, self._node_types_reading = (time.monotonic(), types), False
        return types

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        """Tell the Ray autoscaler about queued demand (replaces the previous request)."""
        self._ensure_connected()
        request_resources(bundles, timeout_s=3 * self.rpc_timeout_s)

    def logs(self, trial_key: str, lines: int = 200) -> str:
        """The tail of what the trial printed (stdout and stderr); "" if unknown."""
        self._ensure_connected()
        with self._lock:
            slot = self._slots.get(trial_key)
        if slot is None:
            return ""
        pending = call(slot.worker.handle.logs, slot.worker.namespace, trial_key, lines)
        try:
            text = read(pending) if ready([pending], self.rpc_timeout_s) else ""
        except Exception:  # noqa: BLE001 - the actor is gone (or answered nonsense): no logs
            return ""
        return text[-LOGS_CHARS:] if isinstance(text, str) else ""

    def describe(self, trial_key: str) -> dict | None:
        """The hosting actor's view: name, pid, node_id, attempt, state, last_seq."""
        self._ensure_connected()
        with self._lock:
            slot = self._slots.get(trial_key)
        if slot is None:
            return None
        pending = call(slot.worker.handle.describe, slot.worker.namespace)
        try:
            if not ready([pending], self.rpc_timeout_s):
                return None
            answer = checked.description(read(pending))
        except Exception:  # noqa: BLE001
            return None
        return answer if answer.get("trial_key") == trial_key else None


def _retired(key: str, slot: Slot, answer: dict | None) -> bool:
    """The trial left threads running in its worker: kill the worker rather than pool it."""
    strays = (answer or {}).get("retire") or []
    if strays:
        log.info("trial %s left threads running (%s): its worker %s is retired",
                 key, ", ".join(strays[:5]), slot.worker.name)
    return bool(strays)


def _probe(address: str, timeout_s: float) -> None:
    """Fail fast on an unreachable ``host:port``: ray.init would retry for minutes."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return    # "auto" and the like: ray.init resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnavailableError(address, f"cannot open a connection to {target}: {_why(host, port, exc)}") from exc


def _why(host: str, port: str, exc: OSError) -> str:
    """What a user fixes, in words: the name, the port, or the network."""
    if isinstance(exc, socket.gaierror):
        return f"the host name {host} does not resolve ({exc.strerror or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused: nothing listens on port {port} of {host}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"no answer from {host}:{port} (timed out)"
    return str(exc)


def _public(resources: Mapping[str, float]) -> dict[str, float]:
    """Drop Ray's internal per-node marker resources (``node:<ip>``)."""
    return {k: float(v) for k, v in resources.items() if not k.startswith("node:")}
