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

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RuntimeEnvSetupError

from kubetune.executors.base import TrialState, TrialUpdate
from kubetune.executors.ray.pool import Worker
from kubetune.spec.results import Result
from kubetune.trainable.host import UNKNOWN

FETCH_HOLD_S = 2.0         # longest an actor holds a long-polling fetch with nothing new


@dataclass
class Slot:
    """A trial this executor knows to be hosted by ``worker``."""
    worker: Worker
    attempt: int | None
    ack: Any = None                     # ObjectRef until the worker confirmed the assignment
    inflight: tuple[Any, int] | None = None   # an unanswered fetch and its after_seq
    final: TrialUpdate | None = None    # terminal state seen with all results delivered
    final_seq: int = 0


def fetch_results(slots: Mapping[str, Slot], cursors: Mapping[str, int], updates: dict[str, TrialUpdate],
                  *, wait_s: float, limit: int, rpc_timeout_s: float) -> None:
    """One round for the trials of ``slots`` that have no update yet in ``updates``."""
    calls: dict[str, tuple[Any, int]] = {}
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
            slot.inflight = (slot.worker.handle.fetch.remote(key, after, limit, hold), after)
            calls[key] = slot.inflight
    refs = [ref for ref, _ in calls.values()]
    if refs:
        if wait_s > 0:
            ray.wait(refs, num_returns=1, timeout=wait_s)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        else:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=rpc_timeout_s)
        ready_set = set(ready)
        for key, (ref, _) in calls.items():
            if ref in ready_set:
                slots[key].inflight = None
                updates[key] = _fetched(key, slots[key], ref, cursors[key])
            else:
                updates[key] = TrialUpdate(key, TrialState.RUNNING, attempt=slots[key].attempt)


def settle_acks(pending: dict[str, Slot], updates: dict[str, TrialUpdate]) -> None:
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
            updates[key] = mark_dead(key, slot, exc)
            continue
        slot.ack = None
        slot.worker.node_id = answer.get("node_id")
        if answer.get("refused"):
            updates[key] = mark_dead(key, slot, RuntimeError(
                f"actor {slot.worker.name} refused the trial: {answer['refused']}"))


def _fetched(key: str, slot: Slot, ref: Any, after: int) -> TrialUpdate:
    try:
        batch = ray.get(ref)
    except ActorUnavailableError:
        return TrialUpdate(key, TrialState.RUNNING, attempt=slot.attempt)
    except Exception as exc:  # noqa: BLE001 - classified in mark_dead
        return mark_dead(key, slot, exc)
    if batch["state"] == UNKNOWN:
        return mark_dead(key, slot, RuntimeError(
            f"actor {slot.worker.name} no longer hosts trial {key}"))
    update = to_update(key, batch, after)
    if update.state.is_terminal:
        # Later polls past the last seq get the same ending without an actor call.
        slot.final = TrialUpdate(key, update.state, (), update.error, attempt=update.attempt,
                                 checkpoint=update.checkpoint, iteration=update.iteration)
        slot.final_seq = batch["last_seq"]
    return update


def to_update(key: str, batch: dict, after: int) -> TrialUpdate:
    """A ``TrialUpdate`` from an actor's answer, with the results after seq ``after``."""
    results = tuple(Result.from_wire(r, attempt=batch.get("attempt")) for r in batch["results"] if r["seq"] > after)
    state = TrialState(batch["state"]) if batch["state"] != UNKNOWN else TrialState.MISSING
    return TrialUpdate(key, state, results, batch.get("error", ""),
                       attempt=batch.get("attempt"), checkpoint=batch.get("checkpoint"),
                       iteration=batch.get("iteration"))


def mark_dead(key: str, slot: Slot, exc: BaseException) -> TrialUpdate:
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


def is_dead(slot: Slot) -> bool:
    return slot.final is not None and slot.final.state in (TrialState.MISSING,)


def is_ready(ref: Any) -> bool:
    ready, _ = ray.wait([ref], timeout=0)
    return bool(ready)
