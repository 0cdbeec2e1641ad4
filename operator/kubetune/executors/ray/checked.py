"""The shapes of trial actors' answers, checked before anything is used (issue 25, N1).

An answer comes from a process that runs the user's code (answers.py), so it is
decoded JSON of any shape: each is checked field by field against what
trainable/host.py sends, with the bounds of spec/results.py; anything else raises
``AnswerError("rejected", ...)`` naming the field, and the trial fails with it.
"""
from __future__ import annotations

import math
from typing import Any

from kubetune.executors.base import TrialState, TrialUpdate
from kubetune.executors.ray.answers import AnswerError
from kubetune.spec.results import INT64_MAX, MetricError, Result, check_iteration, check_metrics
from kubetune.trainable.entrypoint import TRACEBACK_TAIL_CHARS
from kubetune.trainable.function_runner import TERMINAL, RUNNING
from kubetune.trainable.host import UNKNOWN

STATES = frozenset((RUNNING, UNKNOWN, *TERMINAL))
MAX_PATH_CHARS = 4096
MAX_ERROR_CHARS = TRACEBACK_TAIL_CHARS + 10_000    # the tail plus its message line
MAX_NAMES = 100


def _reject(field: str, why: str) -> AnswerError:
    return AnswerError("rejected", f"the trial's actor sent an invalid answer: {field} {why}")


def _int(value: Any, field: str, *, optional: bool = False, low: int = -INT64_MAX) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
        raise _reject(field, f"must be an integer in [{low}, {INT64_MAX}], got {str(value)[:40]!r}")
    return value


def _text(value: Any, field: str, limit: int, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise _reject(field, f"must be a string of at most {limit} characters")
    return value


def checkpoint(value: Any, key: str, field: str) -> str | None:
    """A checkpoint location of trial ``key``'s own (never another trial's directory)."""
    path = _text(value, field, MAX_PATH_CHARS)
    if path is not None and (f"/{key}/" not in path or "/../" in path or "\0" in path):
        raise _reject(field, f"{path[:200]!r} is not a checkpoint of trial {key}")
    return path


def batch(value: Any, key: str, limit: int) -> dict:
    """A fetch/stop answer (FunctionRunner.fetch, TrialHost.stop) of trial ``key``."""
    if not isinstance(value, dict):
        raise _reject("the answer", f"must be an object, got {type(value).__name__}")
    state = value.get("state")
    if state not in STATES:
        raise _reject("state", f"must be one of {sorted(STATES)}, got {str(state)[:40]!r}")
    results = value.get("results")
    if not isinstance(results, list) or len(results) > limit:
        raise _reject("results", f"must be a list of at most {limit}")
    checked = {"state": state, "results": [result(r, key, f"results[{i}]") for i, r in enumerate(results)],
               "error": _text(value.get("error") or "", "error", MAX_ERROR_CHARS, optional=False),
               "attempt": _int(value.get("attempt"), "attempt", optional=True, low=0),
               # a fresh trial's runner starts before the first result: last_seq -1, first seq 0
               # (core/trial.py TrialInfo.last_seq, trainable/function_runner.py start_seq)
               "last_seq": _int(value.get("last_seq", -1), "last_seq", low=-1),
               "iteration": _int(value.get("iteration"), "iteration", optional=True, low=0),
               "checkpoint": checkpoint(value.get("checkpoint"), key, "checkpoint"),
               "ended": bool(value.get("ended")), "retire": names(value.get("retire"), "retire"),
               # the run's start and end on the host's clock: what the usage ledger counts
               "started_at": _epoch(value.get("started_at"), "started_at"),
               "ended_at": _epoch(value.get("ended_at"), "ended_at")}
    return checked


def to_update(key: str, batch: dict, after: int) -> TrialUpdate:
    """A ``TrialUpdate`` from a checked ``batch``, with the results after seq ``after``."""
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


def _epoch(value: Any, field: str) -> float | None:
    """An epoch time in seconds (1970 to 5138), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e11:
        raise _reject(field, "must be epoch seconds")
    return float(value)


def result(value: Any, key: str, field: str) -> dict:
    if not isinstance(value, dict):
        raise _reject(field, "must be an object")
    try:
        metrics = check_metrics(value.get("metrics"))
        iteration = check_iteration(value.get("iteration"))
    except MetricError as exc:
        raise _reject(field, str(exc)[:500]) from None
    timestamp = value.get("timestamp")
    if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, (int, float))
                                  or not math.isfinite(timestamp)):
        raise _reject(f"{field}.timestamp", "must be a finite number")
    return {"seq": _int(value.get("seq"), f"{field}.seq", low=0), "iteration": iteration, "metrics": metrics,
            "timestamp": timestamp, "checkpoint": checkpoint(value.get("checkpoint"), key, f"{field}.checkpoint"),
            "attempt": _int(value.get("attempt"), f"{field}.attempt", optional=True, low=0)}


def names(value: Any, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_NAMES or not all(isinstance(v, str) for v in value):
        raise _reject(field, f"must be a list of at most {MAX_NAMES} strings")
    return [v[:200] for v in value]


def description(value: Any) -> dict:
    """A ``describe``/``assign`` answer (TrialHost._describe_locked)."""
    if not isinstance(value, dict):
        raise _reject("the description", f"must be an object, got {type(value).__name__}")
    shape = value.get("shape")
    if shape is not None and not isinstance(shape, dict):
        raise _reject("shape", "must be an object")
    return {"trial_key": _text(value.get("trial_key"), "trial_key", 512),
            "attempt": _int(value.get("attempt"), "attempt", optional=True, low=0),
            "pool_key": _text(value.get("pool_key"), "pool_key", 512) or "",
            "node_id": _text(value.get("node_id"), "node_id", 256),
            "refused": _text(value.get("refused"), "refused", 2000) or "",
            "stray_threads": _int(value.get("stray_threads", 0), "stray_threads", low=0),
            "shape": shape or {}, "name": _text(value.get("name"), "name", 512),
            "pid": _int(value.get("pid"), "pid", optional=True, low=0),
            "state": _text(value.get("state"), "state", 40),
            "last_seq": _int(value.get("last_seq"), "last_seq", optional=True, low=-1),
            "hosted": _int(value.get("hosted", 0), "hosted", low=0)}
