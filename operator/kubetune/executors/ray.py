"""Run trials as named, detached Ray actors; fetch their results in batched rounds.

Actors.  Every trial runs inside a ``TrialHost`` (trainable/host.py): a threaded,
detached Ray actor in the Ray namespace ``kubetune`` that runs the user's function in
a thread and buffers its reports by sequence number.  Detached, so a restarted
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
them together: one round trip for any number of trials.  With ``wait_s`` > 0 it is
a long poll: the poll returns as soon as one actor answered (at most ``wait_s``);
each actor holds its fetch until it has something new (at most ``FETCH_HOLD_S``), and
the fetches that did not answer yet stay in flight and are reused by the next poll,
so there is always one waiting when a trial reports.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import ray
from ray.exceptions import (ActorUnavailableError, GetTimeoutError, RayActorError,
                            RaySystemError, RuntimeEnvSetupError)
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from kubetune.core.resources import Resources
from kubetune.core.types import Result
from kubetune.executors.base import (ClusterResources, LaunchInfo, LaunchRequest,
                                     NodeResources, RayUnavailableError, ResourceShape,
                                     TrialState, TrialUpdate)
from kubetune.executors.ray_autoscaler import read_node_types
# the actor class lives in a light module: every worker process imports it on start
from kubetune.executors.ray_host import HostActor as _HostActor
from kubetune.executors.ray_liveness import ClusterWatch, prepare_driver_env
from kubetune.trainable.host import UNKNOWN

log = logging.getLogger(__name__)

ACTOR_PREFIX = "kubetune/"
WORKER_MARK = "#w-"        # never part of a Kubernetes name, so never a trial's
PG_MARK = "#pg-"
ACTOR_THREADS = 16         # fetch/stop/describe are served while the function runs
FETCH_HOLD_S = 2.0         # longest an actor holds a long-polling fetch with nothing new
NODE_TYPES_REFRESH_S = 300.0   # an autoscaling config changes rarely (a `ray up` of a new one)


def actor_name(trial_key: str) -> str:
    return ACTOR_PREFIX + trial_key


def _experiment_prefix(trial_key: str) -> str:
    """``"<ns>/<experiment>/"`` of a trial key."""
    parts = trial_key.split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"trial key {trial_key!r} is not '<namespace>/<experiment>/<trial>'")
    return f"{parts[0]}/{parts[1]}/"


@dataclass
class _Worker:
    name: str
    handle: Any
    shape: ResourceShape
    pool_key: str = ""                  # "" for a dedicated actor
    node_id: str | None = None
    placement_group: str | None = None
    idle_since: float = 0.0


@dataclass
class _Slot:
    """A trial this executor knows to be hosted by ``worker``."""
    worker: _Worker
    attempt: int | None
    ack: Any = None                     # ObjectRef until the worker confirmed the assignment
    inflight: tuple[Any, int] | None = None   # an unanswered fetch and its after_seq
    final: TrialUpdate | None = None    # terminal state seen with all results delivered
    final_seq: int = 0


@dataclass
class _Discovery:
    at: float = 0.0
    probing: dict[str, tuple[Any, Any]] = field(default_factory=dict)   # name -> (handle, ref)


class RayExecutor:
    """The Ray implementation of ``executors.base.TrialExecutor``.  Thread-safe."""

    def __init__(self, address: str = "local", *, namespace: str = "kubetune",
                 num_cpus: float | None = None, num_gpus: float | None = None,
                 auth_token: str | None = None, reuse_actors: bool = True,
                 idle_ttl_s: float = 20.0, orphan_timeout_s: float = 600.0,
                 rpc_timeout_s: float = 10.0, log_to_driver: bool = False):
        self.address = address
        self.namespace = namespace
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.reuse_actors = reuse_actors
        self.idle_ttl_s = idle_ttl_s              # idle pooled workers killed after this
        self.orphan_timeout_s = orphan_timeout_s  # a finished trial nobody fetches, then exit
        self.rpc_timeout_s = rpc_timeout_s
        self._auth_token = auth_token
        self._log_to_driver = log_to_driver
        self._lock = threading.RLock()
        self._owns_ray = False
        self._connected = False
        self._watch: ClusterWatch | None = None   # notices the cluster going away (not ``local``)
        self._reset()

    def _reset(self) -> None:
        self._slots: dict[str, _Slot] = {}
        self._idle: dict[str, list[_Worker]] = {}
        self._discovered: dict[str, _Discovery] = {}
        self._node_types: tuple[float, list[Resources] | None] | None = None   # (read at, shapes) of this connection

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
        shape = ResourceShape.of(req.resources)
        prefix = _experiment_prefix(req.trial_key)
        self._discover_once(prefix)
        with self._lock:
            slot = self._slots.get(req.trial_key)
            unanswered = slot is None and bool(self._discovered[prefix].probing)
        if unanswered:
            # An actor of the experiment has not said yet what it hosts (a restarted operator,
            # an actor still starting): it may be this trial, which must not run twice.
            self._discover(prefix, wait_s=self.rpc_timeout_s)
            with self._lock:
                slot = self._slots.get(req.trial_key)
        if slot is not None:
            if slot.attempt in (req.attempt, None) and not self._is_dead(slot):
                return LaunchInfo(req.trial_key, slot.worker.name, attached=True,
                                  placement_group=slot.worker.placement_group)
            self.stop(req.trial_key)    # a previous attempt is still held: end it first
        launch = req.as_dict()
        worker = self._idle_worker(self._pool_key(req, shape)) \
            if self._pooled(shape) else None
        if worker is not None:
            ack = worker.handle.assign.remote(launch)
        else:
            worker = self._create_worker(req, shape, launch)
            ack = worker.handle.describe.remote()
        if req.checkpoint and f"/{req.trial_key}/" not in req.checkpoint:
            # Another trial's checkpoint (PBT): the trial copies it as it starts; wait for
            # that, since its owner keeps it only until the operator fetches a newer one.
            ray.wait([ack], timeout=self.rpc_timeout_s)
        with self._lock:
            self._slots[req.trial_key] = _Slot(worker, req.attempt, ack=ack)
        return LaunchInfo(req.trial_key, worker.name, attached=False,
                          placement_group=worker.placement_group)

    def _pooled(self, shape: ResourceShape) -> bool:
        return self.reuse_actors and shape.bundles == 1

    @staticmethod
    def _pool_key(req: LaunchRequest, shape: ResourceShape) -> str:
        fingerprint = json.dumps([shape.bundle(), req.runtime_env], sort_keys=True, default=str)
        digest = hashlib.sha1(fingerprint.encode()).hexdigest()[:10]
        return _experiment_prefix(req.trial_key) + digest

    def _idle_worker(self, pool_key: str) -> _Worker | None:
        with self._lock:
            self._reap_idle()
            workers = self._idle.get(pool_key)
            return workers.pop() if workers else None

    def _reap_idle(self) -> None:
        deadline = time.monotonic() - self.idle_ttl_s
        for pool_key, workers in list(self._idle.items()):
            expired = [w for w in workers if w.idle_since < deadline]
            for worker in expired:
                workers.remove(worker)
                self._kill(worker)
            if not workers:
                del self._idle[pool_key]

    def _create_worker(self, req: LaunchRequest, shape: ResourceShape, launch: dict) -> _Worker:
        pooled = self._pooled(shape)
        if pooled:
            pool_key = self._pool_key(req, shape)
            name = f"{ACTOR_PREFIX}{pool_key.rsplit('/', 1)[0]}/{WORKER_MARK}" \
                   f"{pool_key.rsplit('/', 1)[1]}-{uuid.uuid4().hex[:8]}"
        else:
            pool_key, name = "", actor_name(req.trial_key)
            self._free_name(name)
        self._evict_idle_for(shape, keep=pool_key)
        options: dict[str, Any] = {
            "name": name, "namespace": self.namespace, "lifetime": "detached",
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
        shape_info = {"cpu": shape.cpu, "gpu": shape.gpu, "memory_bytes": shape.memory_bytes,
                      "custom": dict(shape.custom), "bundles": shape.bundles, "pg": pg_name}
        handle = _HostActor.options(**options).remote(
            name, pool_key, shape_info, launch, idle_timeout_s=3 * self.idle_ttl_s,
            orphan_timeout_s=self.orphan_timeout_s)
        return _Worker(name, handle, shape, pool_key, placement_group=pg_name)

    def _free_name(self, name: str) -> None:
        """A dedicated actor's name may still be held by an earlier attempt: end it."""
        try:
            old = ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return
        ray.kill(old, no_restart=True)
        deadline = time.monotonic() + self.rpc_timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=self.namespace)
            except ValueError:
                return
            time.sleep(0.05)
        raise RayUnavailableError(self.address, f"actor {name!r} did not go away after ray.kill")

    def _evict_idle_for(self, shape: ResourceShape, keep: str) -> None:
        """Kill idle workers of other shapes when a new worker needs what they hold."""
        with self._lock:
            others = sorted((w for key, ws in self._idle.items() if key != keep for w in ws),
                            key=lambda w: w.idle_since)
        if not others:
            return
        available = ray.available_resources()
        for worker in others:
            if all(available.get(k, 0.0) >= v for k, v in shape.total().items()):
                return
            with self._lock:
                workers = self._idle.get(worker.pool_key, [])
                if worker not in workers:
                    continue
                workers.remove(worker)
            self._kill(worker)
            for k, v in worker.shape.bundle().items():
                available[k] = available.get(k, 0.0) + v

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
        self._find_unknown(unknown)
        with self._lock:
            slots = {key: self._slots.get(key) for key in cursors}
            self._reap_idle()
        for key, slot in slots.items():
            if slot is None:
                updates[key] = self._unknown_update(key)
        self._settle_acks({k: s for k, s in slots.items() if s is not None and s.ack is not None},
                          updates)
        calls: dict[str, tuple[Any, int]] = {}
        for key, slot in slots.items():
            if slot is None or key in updates:
                continue
            after = cursors[key]
            if slot.final is not None and after >= slot.final_seq:
                updates[key] = slot.final
            elif slot.inflight is not None and slot.inflight[1] <= after:
                calls[key] = slot.inflight
            else:
                hold = max(wait_s, FETCH_HOLD_S) if wait_s > 0 else 0.0
                slot.inflight = (slot.worker.handle.fetch.remote(key, after, limit, hold), after)
                calls[key] = slot.inflight
        refs = [ref for ref, _ in calls.values()]
        if refs:
            if wait_s > 0:
                ray.wait(refs, num_returns=1, timeout=wait_s)
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            else:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.rpc_timeout_s)
            ready_set = set(ready)
            for key, (ref, _) in calls.items():
                if ref in ready_set:
                    slots[key].inflight = None
                    updates[key] = self._fetched(key, slots[key], ref, cursors[key])
                else:
                    updates[key] = TrialUpdate(key, TrialState.RUNNING, attempt=slots[key].attempt)
        return {key: updates[key] for key in cursors}

    def _settle_acks(self, pending: dict[str, _Slot], updates: dict[str, TrialUpdate]) -> None:
        """Trials whose actor has not confirmed the launch yet: running, or its failure."""
        if not pending:
            return
        refs = [slot.ack for slot in pending.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready_set = set(ready)
        for key, slot in pending.items():
            if slot.ack not in ready_set:
                updates[key] = TrialUpdate(key, TrialState.RUNNING, attempt=slot.attempt)
                continue
            try:
                answer = ray.get(slot.ack)
            except Exception as exc:  # noqa: BLE001 - classified below
                updates[key] = self._mark_dead(key, slot, exc)
                continue
            slot.ack = None
            slot.worker.node_id = answer.get("node_id")
            if answer.get("refused"):
                updates[key] = self._mark_dead(key, slot, RuntimeError(
                    f"actor {slot.worker.name} refused the trial: {answer['refused']}"))

    def _fetched(self, key: str, slot: _Slot, ref: Any, after: int) -> TrialUpdate:
        try:
            batch = ray.get(ref)
        except ActorUnavailableError:
            return TrialUpdate(key, TrialState.RUNNING, attempt=slot.attempt)
        except Exception as exc:  # noqa: BLE001 - classified in _mark_dead
            return self._mark_dead(key, slot, exc)
        if batch["state"] == UNKNOWN:
            return self._mark_dead(key, slot, RuntimeError(
                f"actor {slot.worker.name} no longer hosts trial {key}"))
        update = self._to_update(key, batch, after)
        if update.state.is_terminal:
            # Later polls past the last seq get the same ending without an actor call.
            slot.final = TrialUpdate(key, update.state, (), update.error, attempt=update.attempt,
                                     checkpoint=update.checkpoint, iteration=update.iteration)
            slot.final_seq = batch["last_seq"]
        return update

    @staticmethod
    def _to_update(key: str, batch: dict, after: int) -> TrialUpdate:
        results = tuple(Result(seq=r["seq"], iteration=r["iteration"], metrics=r["metrics"],
                               timestamp=r["timestamp"], checkpoint=r["checkpoint"],
                               attempt=batch.get("attempt"))
                        for r in batch["results"] if r["seq"] > after)
        state = TrialState(batch["state"]) if batch["state"] != UNKNOWN else TrialState.MISSING
        return TrialUpdate(key, state, results, batch.get("error", ""),
                           attempt=batch.get("attempt"), checkpoint=batch.get("checkpoint"),
                           iteration=batch.get("iteration"))

    def _mark_dead(self, key: str, slot: _Slot, exc: BaseException) -> TrialUpdate:
        """The trial's actor is gone or never came up: MISSING (or FAILED for a bad env)."""
        if isinstance(exc, RuntimeEnvSetupError):
            update = TrialUpdate(key, TrialState.FAILED, error=f"runtime_env setup failed: {exc}",
                                 attempt=slot.attempt)
        else:
            text = str(exc)
            cluster = bool(getattr(exc, "preempted", False)) or "node has died" in text \
                or isinstance(exc, GetTimeoutError)
            update = TrialUpdate(key, TrialState.MISSING, error=f"{type(exc).__name__}: {text}",
                                 cluster_fault=cluster, attempt=slot.attempt)
        slot.ack = None
        slot.final, slot.final_seq = update, -1
        return update

    @staticmethod
    def _is_dead(slot: _Slot) -> bool:
        return slot.final is not None and slot.final.state in (TrialState.MISSING,)

    # ---------------------------------------------------------------- discovery (re-attach)

    def _discover_once(self, prefix: str) -> None:
        with self._lock:
            known = prefix in self._discovered
        if not known:
            self._discover(prefix, wait_s=min(2.0, self.rpc_timeout_s))

    def _find_unknown(self, keys: list[str]) -> None:
        """Look for actors hosting trials we do not know (after a restart)."""
        prefixes = {_experiment_prefix(key) for key in keys}
        for prefix in prefixes:
            with self._lock:
                seen = self._discovered.get(prefix)
            if seen is None:
                self._discover(prefix, wait_s=min(2.0, self.rpc_timeout_s))
            elif seen.probing or time.monotonic() - seen.at > 1.0:
                self._discover(prefix, wait_s=0.0)

    def _discover(self, prefix: str, wait_s: float) -> None:
        """Ask every named actor under ``prefix`` what it hosts; adopt what we did not know."""
        names = [ACTOR_PREFIX + name for name in self._actor_names(prefix)]
        with self._lock:
            seen = self._discovered.setdefault(prefix, _Discovery())
            seen.at = time.monotonic()
            known = {s.worker.name for s in self._slots.values()}
            known |= {w.name for ws in self._idle.values() for w in ws}
            for name in names:
                if name in known or name in seen.probing:
                    continue
                try:
                    handle = ray.get_actor(name, namespace=self.namespace)
                except ValueError:
                    continue  # died meanwhile
                seen.probing[name] = (handle, handle.describe.remote())
            probing = dict(seen.probing)
        if not probing:
            return
        refs = [ref for _, ref in probing.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        ready_set = set(ready)
        for name, (handle, ref) in probing.items():
            if ref not in ready_set:
                continue
            with self._lock:
                seen.probing.pop(name, None)
            try:
                answer = ray.get(ref)
            except (RayActorError, GetTimeoutError):
                continue
            self._adopt(name, handle, answer)

    def _adopt(self, name: str, handle: Any, answer: dict) -> None:
        shape_info = answer.get("shape") or {}
        shape = ResourceShape.of(shape_info)
        worker = _Worker(name, handle, shape, answer.get("pool_key") or "",
                         node_id=answer.get("node_id"), placement_group=shape_info.get("pg"))
        with self._lock:
            key = answer.get("trial_key")
            if key is not None and key not in self._slots:
                self._slots[key] = _Slot(worker, answer.get("attempt"))
            elif key is not None and self._slots[key].worker.name != name:
                # it answered too late: the trial was started again elsewhere meanwhile
                log.warning("actor %s also hosts %s, which runs on %s: ending it", name, key,
                            self._slots[key].worker.name)
                self._kill(worker)
            elif key is None and worker.pool_key:
                worker.idle_since = time.monotonic()
                self._idle.setdefault(worker.pool_key, []).append(worker)
            elif key is None:
                self._kill(worker)   # a dedicated actor hosting nothing: a leftover

    def _unknown_update(self, key: str) -> TrialUpdate:
        with self._lock:
            seen = self._discovered.get(_experiment_prefix(key))
            starting = seen is not None and any(
                name.startswith(ACTOR_PREFIX + _experiment_prefix(key) + WORKER_MARK)
                or name == actor_name(key) for name in seen.probing)
        if starting:   # an actor of that experiment has not answered yet: maybe it hosts it
            return TrialUpdate(key, TrialState.RUNNING)
        return TrialUpdate(key, TrialState.MISSING, cluster_fault=True, error=(
            f"no Ray actor hosts trial {key} (Ray namespace {self.namespace!r}): "
            "the Ray cluster restarted or the actor was removed"))

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
                self._find_unknown([key])
                with self._lock:
                    slot = self._slots.get(key)
            if slot is None:
                self._remove_placement_groups(actor_name(key))
                return None
            update, ended = self._stop_slot(key, slot, after_seq, timeout_s, at_checkpoint)
            with self._lock:
                self._slots.pop(key, None)
            worker = slot.worker
            if ended and worker.pool_key:
                worker.idle_since = time.monotonic()
                with self._lock:
                    self._idle.setdefault(worker.pool_key, []).append(worker)
            else:
                self._kill(worker)
            return update
        except Exception:  # noqa: BLE001 - stop must never raise
            log.exception("stopping trial %s", key)
            return None

    def _stop_slot(self, key: str, slot: _Slot, after_seq: int | None, timeout_s: float,
                   at_checkpoint: bool) -> tuple[TrialUpdate | None, bool]:
        if self._is_dead(slot) or slot.ack is not None and not self._ready(slot.ack):
            return slot.final, False
        if slot.final is not None and after_seq is None:
            slot.worker.handle.release.remote(key)     # done already: nothing to wait for
            return slot.final, True
        ref = slot.worker.handle.stop.remote(key, timeout_s, after_seq, at_checkpoint)
        try:
            batch = ray.get(ref, timeout=timeout_s + self.rpc_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the actor is killed below
            log.info("trial %s did not stop gracefully: %s", key, exc)
            return None, False
        update = self._to_update(key, batch, batch["last_seq"] if after_seq is None else after_seq)
        return update, bool(batch.get("ended"))

    @staticmethod
    def _ready(ref: Any) -> bool:
        ready, _ = ray.wait([ref], timeout=0)
        return bool(ready)

    def _kill(self, worker: _Worker) -> None:
        try:
            ray.kill(worker.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        if worker.placement_group:
            self._remove_placement_groups(worker.name)

    def _remove_placement_groups(self, name_prefix: str) -> int:
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

    # ---------------------------------------------------------------- listing, cleanup

    def list_trials(self, prefix: str = "") -> list[str]:
        """Trials hosted by live actors whose key starts with ``prefix`` (re-attach, cleanup)."""
        self._ensure_connected()
        for experiment in sorted({"/".join(name.split("/")[:2]) + "/"
                                  for name in self._actor_names("")}):
            if experiment.startswith(prefix) or prefix.startswith(experiment):
                self._discover(experiment, wait_s=min(2.0, self.rpc_timeout_s))
        with self._lock:
            return sorted(key for key, slot in self._slots.items()
                          if key.startswith(prefix) and not self._is_dead(slot))

    def _actor_names(self, prefix: str) -> list[str]:
        """Names of our live actors under a trial-key prefix, without ``kubetune/``."""
        return [a["name"][len(ACTOR_PREFIX):]
                for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == self.namespace
                and a["name"].startswith(ACTOR_PREFIX + prefix)]

    def stop_all(self, prefix: str) -> int:
        """Kill every actor (trials and idle workers) whose trial key starts with ``prefix``.

        For a deleted experiment: ``stop_all("<ns>/<experiment>/")``.  Returns how many
        actors were killed.  Never raises.
        """
        try:
            self._ensure_connected()
            names = [ACTOR_PREFIX + name for name in self._actor_names(prefix)]
            for name in names:
                try:
                    ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)
                except ValueError:
                    pass
            with self._lock:
                for key in [k for k in self._slots if k.startswith(prefix)]:
                    del self._slots[key]
                for pool_key in [k for k in self._idle if k.startswith(prefix)]:
                    del self._idle[pool_key]
                for discovered in [k for k in self._discovered if k.startswith(prefix)]:
                    del self._discovered[discovered]
            self._remove_placement_groups(ACTOR_PREFIX + prefix)
            return len(names)
        except Exception:  # noqa: BLE001
            log.exception("stopping all trials under %s", prefix)
            return 0

    # ---------------------------------------------------------------- resources, logs

    def cluster_resources(self) -> ClusterResources:
        """Totals, what is free (idle pooled workers count as free), and per node."""
        self._ensure_connected()
        try:
            total = _public(ray.cluster_resources())
            available = _public(ray.available_resources())
            per_node = {}
            try:
                from ray._private.state import available_resources_per_node
                per_node = {k: _public(v) for k, v in available_resources_per_node().items()}
            except Exception:  # noqa: BLE001 - not offered through Ray Client
                pass
            nodes_info = [n for n in ray.nodes() if n.get("Alive")]
        except Exception as exc:  # noqa: BLE001
            self.disconnect()    # connect afresh next time (Ray Client has no ClusterWatch)
            raise RayUnavailableError(self.address, f"{type(exc).__name__}: {exc}") from exc
        with self._lock:
            idle = [w for ws in self._idle.values() for w in ws]
        for worker in idle:
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
        the autoscaler's config on the head node once per connection and again every
        ``NODE_TYPES_REFRESH_S``; a failed re-read keeps the last answer, a failed first
        read raises ``RayUnavailableError`` (unknown must not pass for "cannot grow":
        every GPU trial on a head without GPUs would fail as infeasible)."""
        if self.address == "local":
            return None      # an embedded cluster is this process's machine
        self._ensure_connected()
        with self._lock:
            known = self._node_types
        if known is not None and time.monotonic() - known[0] < NODE_TYPES_REFRESH_S:
            return known[1]
        try:
            shapes = read_node_types(timeout_s=3 * self.rpc_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure: the head did not tell
            if known is not None:
                log.warning("cannot re-read the autoscaler's node types: %s: %s", type(exc).__name__, exc)
                return known[1]
            raise RayUnavailableError(self.address, "cannot read the autoscaler's node types from the "
                                      f"head node: {type(exc).__name__}: {exc}") from exc
        types = [Resources.from_ray(shape) for shape in shapes] if shapes is not None else None
        with self._lock:
            self._node_types = (time.monotonic(), types)
        return types

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        """Tell the Ray autoscaler about queued demand (replaces the previous request)."""
        self._ensure_connected()
        from ray.autoscaler.sdk import request_resources
        request_resources(bundles=bundles)

    def logs(self, trial_key: str, lines: int = 200) -> str:
        """The tail of what the trial printed (stdout and stderr); "" if unknown."""
        self._ensure_connected()
        with self._lock:
            slot = self._slots.get(trial_key)
        if slot is None:
            return ""
        try:
            return ray.get(slot.worker.handle.logs.remote(trial_key, lines),
                           timeout=self.rpc_timeout_s) or ""
        except Exception:  # noqa: BLE001 - the actor is gone: no logs
            return ""

    def describe(self, trial_key: str) -> dict | None:
        """The hosting actor's view: name, pid, node_id, attempt, state, last_seq."""
        self._ensure_connected()
        with self._lock:
            slot = self._slots.get(trial_key)
        if slot is None:
            return None
        try:
            answer = ray.get(slot.worker.handle.describe.remote(), timeout=self.rpc_timeout_s)
        except Exception:  # noqa: BLE001
            return None
        return answer if answer.get("trial_key") == trial_key else None


def _probe(address: str, timeout_s: float) -> None:
    """Fail fast on an unreachable ``host:port``: ray.init would retry for minutes."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return    # "auto" and the like: ray.init resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RayUnavailableError(address, f"cannot open a connection to {target}: {exc}") from exc


def _public(resources: Mapping[str, float]) -> dict[str, float]:
    """Drop Ray's internal per-node marker resources (``node:<ip>``)."""
    return {k: float(v) for k, v in resources.items() if not k.startswith("node:")}
