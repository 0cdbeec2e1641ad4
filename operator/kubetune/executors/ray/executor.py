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
them together: one round trip for any number of trials.  With ``wait_s`` > 0 it is a
long poll: it returns as soon as one actor answered (at most ``wait_s``); each actor
holds its fetch until it has something new (at most ``FETCH_HOLD_S``), and the
fetches that did not answer yet stay in flight (``Slot.inflight``) and are reused by
the next round, so there is always one waiting when a trial reports.

This module is the executor's surface and its poll; the parts live beside it:
``slots`` (which actor hosts which trial; launching and ending trials), ``pool``
(actor names, creating actors, the idle pool), ``discovery`` (re-attaching after a
restart; ``named_actors``: one listing shared by every Experiment), ``capacity``
(what the cluster offers), ``liveness`` (a lost cluster).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Mapping

import ray
from ray.exceptions import RaySystemError

from kubetune.core.resources import Resources
from kubetune.executors.base import ClusterResources, LaunchInfo, LaunchRequest, TrialState, TrialUpdate
from kubetune.executors.ray import answers, capacity, checked, named_actors
from kubetune.executors.ray.answers import AnswerError, Call, call, read, ready
from kubetune.executors.ray.autoscaler import request_resources
from kubetune.executors.ray.discovery import ActorDiscovery, actor_group, list_named_actors
from kubetune.executors.ray.errors import RayUnavailableError, is_unavailable
from kubetune.executors.ray.liveness import ClusterWatch, prepare_driver_env, probe
from kubetune.executors.ray.pool import ACTOR_PREFIX, WorkerPool, actor_name, namespace_of_actor
from kubetune.executors.ray.slots import Slot, TrialSlots, mark_dead, settle_acks
from kubetune.trainable.host import UNKNOWN

log = logging.getLogger(__name__)

LOGS_CHARS = 1 << 20           # the tail of a trial's output the operator takes
FETCH_HOLD_S = 2.0             # longest an actor holds a long-polling fetch with nothing new

__all__ = ["ACTOR_PREFIX", "RayExecutor", "actor_name"]


class RayExecutor:
    """The Ray implementation of ``executors.base.TrialExecutor``.  Thread-safe."""

    def __init__(self, address: str = "local", *, namespace: str = "kubetune",
                 num_cpus: float | None = None, num_gpus: float | None = None,
                 auth_token: str | None = None, reuse_actors: bool = True,
                 idle_ttl_s: float = 20.0, orphan_timeout_s: float = 600.0,
                 rpc_timeout_s: float = 10.0, log_to_driver: bool = False, lease_timeout_s: float = 0.0,
                 listing_max_age_s: float = named_actors.MAX_AGE_S):
        self.address = address
        self.namespace = namespace
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.reuse_actors = reuse_actors
        self.idle_ttl_s = idle_ttl_s              # idle pooled workers killed after this
        self.orphan_timeout_s = orphan_timeout_s  # a finished trial nobody fetches, then exit
        self.lease_timeout_s = lease_timeout_s    # a running trial nobody calls, then stop and exit (0: never)
        self.rpc_timeout_s = rpc_timeout_s
        self.listing_max_age_s = listing_max_age_s   # one listing of the named actors serves this long
        self._auth_token = auth_token
        self._log_to_driver = log_to_driver
        self._lock = threading.RLock()
        self._owns_ray = False
        self._connected = False
        self._watch: ClusterWatch | None = None   # notices the cluster going away (not ``local``)
        self._reset()

    def _reset(self) -> None:
        held: dict[str, Slot] = {}
        self._named = named_actors.NamedActors(list_named_actors, actor_group, max_age_s=self.listing_max_age_s)
        self._pool = WorkerPool(self._lock, address=self.address, namespace=self.namespace,
                                reuse_actors=self.reuse_actors, idle_ttl_s=self.idle_ttl_s,
                                orphan_timeout_s=self.orphan_timeout_s, rpc_timeout_s=self.rpc_timeout_s,
                                lease_timeout_s=self.lease_timeout_s, on_kill=self._named.killed)
        self._discovery = ActorDiscovery(self._lock, held, self._pool, namespace=self.namespace,
                                         rpc_timeout_s=self.rpc_timeout_s, named=self._named)
        self._slots = TrialSlots(self._lock, held, self._pool, self._discovery, rpc_timeout_s=self.rpc_timeout_s)
        self._node_types = capacity.NodeTypes(self.address, self.rpc_timeout_s)   # of this connection

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
                    probe(self.address, self.rpc_timeout_s)
                prepare_driver_env(self.address)
                try:
                    ray.init(**options)
                except Exception as exc:  # noqa: BLE001 - ray.init raises many types
                    raise RayUnavailableError(self.address, f"{type(exc).__name__}: {exc}") from exc
                self._owns_ray = True
            if self.address != "local":
                self._watch = ClusterWatch.attach(timeout_s=min(2.0, self.rpc_timeout_s))
            self._connected = True

    def gcs_endpoint(self) -> tuple[str, int] | None:
        """The watched GCS's host and port (None: ``local``, Ray Client, or not connected)."""
        watch = self._watch
        return watch.endpoint if watch is not None else None

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

    def close(self) -> None:
        """As ``disconnect``: this process's driver is the connection."""
        self.disconnect()

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
        return self._slots.launch(req)

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
            unknown = [key for key in cursors if key not in self._slots.held]
        self._discovery.find_unknown(unknown)
        with self._lock:
            slots = {key: self._slots.held.get(key) for key in cursors}
        self._pool.reap_idle()      # Ray calls: outside the lock (pool.py)
        for key, slot in slots.items():
            if slot is None:
                updates[key] = self._discovery.unknown_update(key)
        known = {key: slot for key, slot in slots.items() if slot is not None}
        settle_acks({key: slot for key, slot in known.items() if slot.ack is not None}, updates)
        self._fetch(known, cursors, updates, wait_s=wait_s, limit=limit)
        return {key: updates[key] for key in cursors}

    def _fetch(self, slots: Mapping[str, Slot], cursors: Mapping[str, int], updates: dict[str, TrialUpdate],
               *, wait_s: float, limit: int) -> None:
        """One round for the trials of ``slots`` that have no update yet in ``updates``."""
        calls: dict[str, tuple[Call, int]] = {}
        for key, slot in slots.items():
            if key in updates:
                continue
            after = cursors[key]
            if slot.final is not None and after >= slot.final_seq:
                updates[key] = slot.final
            elif slot.inflight is not None and slot.inflight[1] <= after:
                calls[key] = slot.inflight
            else:
                hold = max(wait_s, FETCH_HOLD_S) if wait_s > 0 else 0.0
                slot.inflight = (call(slot.worker.handle.fetch, slot.worker.namespace, key, after, limit, hold), after)
                calls[key] = slot.inflight
        pending = [c for c, _ in calls.values()]
        if pending:
            if wait_s > 0:
                ready(pending, wait_s, num_returns=1)
                done = ready(pending, 0)
            else:
                done = ready(pending, self.rpc_timeout_s)
            for key, (inflight, _) in calls.items():
                if inflight.ref in done:
                    slots[key].inflight = None
                    updates[key] = _fetched(key, slots[key], inflight, cursors[key], limit)
                else:
                    updates[key] = TrialUpdate(key, TrialState.RUNNING, attempt=slots[key].attempt)

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
        except Exception:  # noqa: BLE001 - stop must never raise
            log.exception("stopping trial %s", key)
            return None
        return self._slots.end(key, after_seq, timeout_s, at_checkpoint)

    # ---------------------------------------------------------------- listing, cleanup

    def list_trials(self, prefix: str = "") -> list[str]:
        """Trials hosted by live actors whose key starts with ``prefix`` (re-attach, cleanup)."""
        self._ensure_connected()
        for experiment in self._discovery.experiments(prefix):
            self._discovery.discover(experiment, wait_s=self._discovery.first_wait_s)
        return self._slots.live(prefix)

    def stop_all(self, prefix: str) -> int:
        """Kill every actor (trials and idle workers) whose trial key starts with ``prefix``.

        For a deleted experiment: ``stop_all("<ns>/<experiment>/")``.  Returns how many
        actors were killed.  Never raises.
        """
        try:
            self._ensure_connected()
            names = [ACTOR_PREFIX + name   # fresh: an actor created a moment ago is ended too
                     for name in self._discovery.actor_names(prefix, fresh=True)]
            for name in names:
                self._named.killed(name)
                try:
                    ray.kill(ray.get_actor(name, namespace=namespace_of_actor(self.namespace, name)),
                             no_restart=True)
                except ValueError:
                    pass
            for namespace in {namespace_of_actor(self.namespace, name) for name in names}:
                answers.forget(namespace)
            with self._lock:
                self._slots.forget(prefix)
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
        return len(self._discovery.actor_names(prefix, fresh=True))

    # ---------------------------------------------------------------- resources, logs

    def cluster_resources(self) -> ClusterResources:
        """Totals, what is free (idle pooled workers count as free), and per node."""
        self._ensure_connected()
        try:
            seen = capacity.read_cluster()
        except Exception as exc:  # noqa: BLE001
            self.disconnect()    # connect afresh next time (Ray Client has no ClusterWatch)
            raise RayUnavailableError(self.address, f"{type(exc).__name__}: {exc}") from exc
        return capacity.cluster_resources(seen, self._pool.idle_workers())

    def node_types(self) -> list[Resources] | None:
        """The largest shape of each node type the Ray autoscaler may add, or None when the
        cluster cannot grow (capacity.NodeTypes: how it is read and kept fresh)."""
        if self.address == "local":
            return None      # an embedded cluster is this process's machine
        self._ensure_connected()
        return self._node_types.get()

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        """Tell the Ray autoscaler about queued demand (replaces the previous request)."""
        self._ensure_connected()
        request_resources(bundles, timeout_s=3 * self.rpc_timeout_s)

    def logs(self, trial_key: str, lines: int = 200) -> str:
        """The tail of what the trial printed (stdout and stderr); "" if unknown."""
        self._ensure_connected()
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


def _fetched(key: str, slot: Slot, done: Call, after: int, limit: int) -> TrialUpdate:
    try:
        batch = checked.batch(read(done), key, limit)
    except AnswerError as exc:
        if exc.kind == "unavailable":
            return TrialUpdate(key, TrialState.RUNNING, attempt=slot.attempt)
        return mark_dead(key, slot, exc)
    if batch["state"] == UNKNOWN:
        return mark_dead(key, slot, AnswerError(
            "died", f"actor {slot.worker.name} no longer hosts trial {key}"))
    update = checked.to_update(key, batch, after)
    if update.state.is_terminal:
        # Later polls past the last seq get the same ending without an actor call.
        slot.final = TrialUpdate(key, update.state, (), update.error, attempt=update.attempt,
                                 checkpoint=update.checkpoint, iteration=update.iteration,
                                 run_started=update.run_started, run_ended=update.run_ended)
        slot.final_seq = batch["last_seq"]
    return update
