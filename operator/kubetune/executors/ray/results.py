"""Fetching trial results from their actors in batched rounds (see executors/ray/executor.py).

``fetch_results`` fires one ``fetch(after_seq)`` per trial, then waits for all of
them together: one round trip for any number of trials.  With ``wait_s`` > 0 it is
a long poll: it returns as soon as one actor answered (at most ``wait_s``); each
actor holds its fetch until it has something new (at most ``FETCH_HOLD_S``), and
the fetches that did not answer yet stay in flight (``Slot.inflight``) and are
reused by the next round, so there is always one waiting when a trial reports.
"""
from __future__ import annotations

from typing import Mapping

from kubetune.executors.base import TrialState, TrialUpdate
from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError, Call, call, read, ready
from kubetune.executors.ray.slots import Slot, mark_dead
from kubetune.trainable.host import UNKNOWN

FETCH_HOLD_S = 2.0         # longest an actor holds a long-polling fetch with nothing new


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
    update = checked.to_update(key, batch, after)
    if update.state.is_terminal:
        # Later polls past the last seq get the same ending without an actor call.
        slot.final = TrialUpdate(key, update.state, (), update.error, attempt=update.attempt,
                                 checkpoint=update.checkpoint, iteration=update.iteration,
                                 run_started=update.run_started, run_ended=update.run_ended)
        slot.final_seq = batch["last_seq"]
    return update
