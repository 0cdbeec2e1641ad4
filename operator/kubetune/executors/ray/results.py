"""Fetching trial results from their actors in batched rounds (see executors/ray/executor.py).

``fetch_results`` fires one ``fetch(after_seq)`` per trial, then waits for all of
them together: one round trip for any number of trials.  With ``wait_s`` > 0 it is
a long poll: it returns as soon as one actor answered (at most ``wait_s``); each
actor holds its fetch until it has something new (at most ``FETCH_HOLD_S``), and
the fetches that did not answer yet stay in flight (``Slot.inflight``) and are
reused by the next round, so there is always one waiting when a trial reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kubetune.executors.base import TrialState, TrialUpdate
from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError, Call, call, read, ready
from kubetune.executors.ray.pool import Worker
from kubetune.spec.results import Result
from kubetune.trainable.host import UNKNOWN

FETCH_HOLD_S = 2.0         # longest an actor holds a long-polling fetch with nothing new


@dataclass
class Slot:
    """A trial this executor knows to be hosted by ``worker``."""
    worker: Worker
    attempt: int | None
    ack: Call | None = None             # until the worker confirmed the assignment
    inflight: tuple[Call, int] | None = None   # an unanswered fetch and its after_seq
    final: TrialUpdate | None = None    # terminal state seen with all results delivered
    final_seq: int = 0


def fetch_results(slots: Mapping[str, Slot], cursors: Mapping[str, int], updates: dict[str, TrialUpdate],
                  *, wait_s: float, limit: int, rpc_timeout_s: float) -> None:
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
            done = ready(pending, rpc_timeout_s)
        for key, (inflight, _) in calls.items():
            if inflight.ref in done:
                slots[key].inflight = None
                updates[key] = _fetched(key, slots[key], inflight, cursors[key], limit)
            else:
                updates[key] = TrialUpdate(key, TrialState.RUNNING, attempt=slots[key].attempt)


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
    update = to_update(key, batch, after)
    if update.state.is_terminal:
        # Later polls past the last seq get the same ending without an actor call.
        slot.final = TrialUpdate(key, update.state, (), update.error, attempt=update.attempt,
                                 checkpoint=update.checkpoint, iteration=update.iteration,
                                 run_started=update.run_started, run_ended=update.run_ended)
        slot.final_seq = batch["last_seq"]
    return update


def to_update(key: str, batch: dict, after: int) -> TrialUpdate:
    """A ``TrialUpdate`` from an actor's answer (checked.batch), with the results after seq ``after``."""
    results = tuple(Result.from_wire(r, attempt=batch.get("attempt")) for r in batch["results"] if r["seq"] > after)
    state = TrialState(batch["state"]) if batch["state"] != UNKNOWN else TrialState.MISSING
    return TrialUpdate(key, state, results, batch.get("error", ""),
                       attempt=batch.get("attempt"), checkpoint=batch.get("checkpoint"),
                       iteration=batch.get("iteration"), run_started=_seconds(batch.get("started_at")),
                       run_ended=_seconds(batch.get("ended_at")))


def _seconds(value: object) -> float | None:
    """An epoch time from the actor's answer, or None: a host is not trusted to send a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e11:
        return float(value)
    return None


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
