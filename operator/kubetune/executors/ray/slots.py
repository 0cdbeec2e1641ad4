"""Which actor hosts which trial, and the two moves that change it: launching a trial
onto an actor (an idle pooled worker, or a new actor) and ending it there (stop, pause).

A trial the executor knows is a ``Slot``: its worker, the attempt, and what is in
flight with it.  ``TrialSlots`` keeps them, with the shapes of the actors other
threads are creating (``busy``: what a new actor must leave room for, and what an
idle worker may be evicted for).  Until its actor confirmed a launch, a trial shows
as running (``settle_acks``, in each poll).  The executor's poll reads the same slots
(executors/ray/executor.py); discovery fills them after a restart (discovery.py).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubetune.executors.base import LaunchDeferred, LaunchInfo, LaunchRequest, TrialState, TrialUpdate
from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError, Call, call, read, ready
from kubetune.executors.ray.pool import Worker, WorkerPool, actor_name, experiment_prefix
from kubetune.spec.model import TrialResources

if TYPE_CHECKING:
    from kubetune.executors.ray.discovery import ActorDiscovery

log = logging.getLogger(__name__)

SILENT_ACTOR_ROUNDS = 60    # silent_actor_bound_s in rpc_timeout_s: 10 min by default


@dataclass
class Slot:
    """A trial this executor knows to be hosted by ``worker``."""
    worker: Worker
    attempt: int | None
    ack: Call | None = None             # until the worker confirmed the assignment
    inflight: tuple[Call, int] | None = None   # an unanswered fetch and its after_seq
    final: TrialUpdate | None = None    # terminal state seen with all results delivered
    final_seq: int = 0


class TrialSlots:
    """The trials of one connection and their actors.  ``lock`` guards ``held`` (shared
    with the pool and discovery)."""

    def __init__(self, lock: threading.RLock, held: dict[str, Slot], pool: WorkerPool,
                 discovery: ActorDiscovery, *, rpc_timeout_s: float) -> None:
        self._lock = lock
        self.held = held
        self._starting: dict[str, TrialResources] = {}   # trial key -> shape of the actor being created
        self._pool = pool
        self._discovery = discovery
        self.rpc_timeout_s = rpc_timeout_s
        # how long an actor of an experiment may stay silent before a launch ends it: bounded,
        # or one that never answers would hold its experiment's launches forever; no shorter
        # than Ray's own runtime_env setup timeout (600 s), nor than a GPU node's scale-up
        self.silent_actor_bound_s = SILENT_ACTOR_ROUNDS * rpc_timeout_s

    def get(self, key: str) -> Slot | None:
        with self._lock:
            return self.held.get(key)

    def live(self, prefix: str) -> list[str]:
        with self._lock:
            return sorted(key for key, slot in self.held.items() if key.startswith(prefix) and not is_dead(slot))

    def forget(self, prefix: str) -> None:
        with self._lock:
            for key in [k for k in self.held if k.startswith(prefix)]:
                del self.held[key]

    def _busy(self) -> list[TrialResources]:
        """The shapes of our actors that run trials or are being created (under the lock)."""
        return [slot.worker.shape for slot in self.held.values() if not is_dead(slot)] + list(self._starting.values())

    # ---------------------------------------------------------------- launch

    def launch(self, req: LaunchRequest) -> LaunchInfo:
        """Launch one attempt of a trial; attach instead if that attempt already runs."""
        shape = TrialResources.of(req.resources)
        prefix = experiment_prefix(req.trial_key)
        self._discovery.discover_once(prefix)
        slot = self.get(req.trial_key)
        if slot is None:
            self._wait_for_silent_actors(req.trial_key, prefix)
            slot = self.get(req.trial_key)
        if slot is not None:
            if slot.attempt in (req.attempt, None) and not is_dead(slot):
                return LaunchInfo(req.trial_key, slot.worker.name, attached=True,
                                  placement_group=slot.worker.placement_group)
            self.end(req.trial_key, None, 5.0, at_checkpoint=False)   # a previous attempt is still held
        launch = req.as_dict()
        worker = self._pool.take_idle(self._pool.pool_key(req, shape)) if self._pool.pooled(shape) else None
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
            self.held[req.trial_key] = Slot(worker, req.attempt, ack=ack)
            self._starting.pop(req.trial_key, None)
        return LaunchInfo(req.trial_key, worker.name, attached=False, placement_group=worker.placement_group)

    def _wait_for_silent_actors(self, key: str, prefix: str) -> None:
        """Raise ``LaunchDeferred`` while an actor of the experiment has not said yet what
        it hosts: a restarted operator finds the last one's workers still starting, and a
        worker's constructor starts its trial, so this trial may be running there already.
        Waiting here a fixed time and then launching anyway ran such a trial twice, both
        to the end (issue 26).  An actor silent for ``silent_actor_bound_s`` is killed
        first: whatever it hosts is then relaunched (MISSING), never run beside itself."""
        if not self._discovery.silent(key):
            return
        self._discovery.discover(prefix, wait_s=0.0)    # read the answers that came meanwhile
        silent = self._discovery.silent(key)
        if not silent or self.get(key) is not None:
            return
        overdue = sorted(name for name, age in silent.items() if age >= self.silent_actor_bound_s)
        if len(overdue) < len(silent):
            # no age in the message: it is the Trial's status message, rewritten when it changes
            name = max(silent, key=silent.__getitem__)
            raise LaunchDeferred(
                f"{len(silent)} Ray actor(s) of its Experiment (e.g. {name}) have not said yet which trial "
                f"they host, maybe this one: launched once they answer (killed after "
                f"{self.silent_actor_bound_s:.0f}s without an answer)")
        why = (f"SilentActorEnded: kubetune ended Ray actor(s) {', '.join(overdue)[:500]}, which had not said "
               f"in {self.silent_actor_bound_s:.0f}s which trial they host, before launching {key}: a trial "
               "they hosted would otherwise have run twice")
        log.warning("%s", why)
        self._discovery.end_silent(prefix, overdue, why)

    # ---------------------------------------------------------------- stop / pause

    def end(self, key: str, after_seq: int | None, timeout_s: float, at_checkpoint: bool) -> TrialUpdate | None:
        """Stop (or pause) the trial, then pool its worker or kill it (RayExecutor.stop
        and .pause say how).  Never raises."""
        try:
            slot = self.get(key)
            if slot is None:
                self._discovery.find_unknown([key])
                slot = self.get(key)
            if slot is None:
                self._pool.remove_placement_groups(actor_name(key))
                return None
            update, ended = self._stop(key, slot, after_seq, timeout_s, at_checkpoint)
            with self._lock:
                self.held.pop(key, None)
                busy = self._busy()
            if ended and slot.worker.pool_key:
                self._pool.give_back(slot.worker, busy)
            else:
                self._pool.kill(slot.worker)
            return update
        except Exception:  # noqa: BLE001 - stop must never raise
            log.exception("stopping trial %s", key)
            return None

    def _stop(self, key: str, slot: Slot, after_seq: int | None, timeout_s: float,
              at_checkpoint: bool) -> tuple[TrialUpdate | None, bool]:
        """The trial's final update, and whether its worker may host another trial."""
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
        except Exception as exc:  # noqa: BLE001 - the actor is killed by the caller
            log.info("trial %s did not stop gracefully: %s", key, exc)
            if isinstance(exc, AnswerError) and exc.kind == "rejected":
                return mark_dead(key, slot, exc), False
            return None, False
        update = checked.to_update(key, batch, batch["last_seq"] if after_seq is None else after_seq)
        return update, batch["ended"] and not _retired(key, slot, batch)


def _retired(key: str, slot: Slot, answer: dict | None) -> bool:
    """The trial left threads running in its worker: kill the worker rather than pool it."""
    strays = (answer or {}).get("retire") or []
    if strays:
        log.info("trial %s left threads running (%s): its worker %s is retired",
                 key, ", ".join(strays[:5]), slot.worker.name)
    return bool(strays)


def settle_acks(pending: dict[str, Slot], updates: dict[str, TrialUpdate]) -> None:
    """Trials whose actor has not confirmed the launch yet: running, or its failure."""
    if not pending:
        return
    done = ready([slot.ack for slot in pending.values()], 0)
    for key, slot in pending.items():
        if slot.ack.ref not in done:
            updates[key] = TrialUpdate(key, TrialState.RUNNING, attempt=slot.attempt)
            continue
        try:
            answer = checked.description(read(slot.ack))
        except AnswerError as exc:
            updates[key] = mark_dead(key, slot, exc)
            continue
        slot.ack = None
        slot.worker.node_id = answer["node_id"]
        if answer["refused"]:
            updates[key] = mark_dead(key, slot, AnswerError(
                "died", f"actor {slot.worker.name} refused the trial: {answer['refused']}"))


def mark_dead(key: str, slot: Slot, error: AnswerError) -> TrialUpdate:
    """The trial's actor is gone, never came up, or answered what is not kubetune's:
    MISSING (a Ray fault), or FAILED (a bad runtime_env, a rejected or raising answer)."""
    if error.kind == "runtime_env":
        update = TrialUpdate(key, TrialState.FAILED, error=str(error), attempt=slot.attempt)
    elif error.kind in ("rejected", "raised"):
        update = TrialUpdate(key, TrialState.FAILED, attempt=slot.attempt,
                             error=f"TrialRejected: {error}; kubetune ended the trial")
    else:
        name = "ActorDiedError" if error.kind == "died" else "RayClusterError"
        update = TrialUpdate(key, TrialState.MISSING, error=f"{name}: {error}",
                             cluster_fault=error.kind in ("cluster", "unavailable"), attempt=slot.attempt)
    slot.ack = None
    slot.final, slot.final_seq = update, -1
    return update


def is_dead(slot: Slot) -> bool:
    return slot.final is not None and slot.final.state in (TrialState.MISSING, TrialState.FAILED) \
        and slot.final_seq == -1


def is_ready(pending: Call) -> bool:
    return bool(ready([pending], 0))
