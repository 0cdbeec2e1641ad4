"""What a Ray driver process answers the operator: bounded JSON, checked field by field
(issue 25, N2).

A driver process (process.py) talks to a Ray cluster other than the operator's own, by
default a Service in the Experiment's namespace: a tenant's.  Ray Client unpickles what
that cluster sends, so a hostile cluster may run code in the driver process.  The
operator therefore reads nothing pickled from it: each answer is JSON (``encode`` in
the child), and the operator rebuilds the executor's types from it (``decode``),
checking each field with the bounds a trial actor's own answers have (checked.py), and
that an answer is about the trials it was asked about (a poll's keys, a stop's key).
Whatever fails a check is a ``WireError``; the operator then ends that driver process.
An error the child raised crosses as its type's name and message only: "unavailable"
(the cluster cannot be reached), a launch deferred (``LaunchDeferred``), or neither,
nothing else.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Mapping

from kubetune.executors.base import (ClusterResources, ExecutorError, LaunchDeferred, LaunchInfo, NodeResources,
                                     PlatformUnavailableError, TrialState, TrialUpdate)
from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.spec.resources import Resources
from kubetune.spec.results import Result

# a poll answers for every trial of the cluster at once, each cut at the fetch batch
# (8 MiB, trainable/function_runner.py): bounded here as a whole
MAX_ANSWER_BYTES = 512 << 20
MAX_TEXT = 1 << 20          # a log tail (executor.LOGS_CHARS), an error message
MAX_NAME = 512              # a trial key, an actor's or placement group's name
MAX_ITEMS = 100_000         # trials listed, nodes, resource kinds
CONNECTION_ERRORS = frozenset({"RayUnavailableError", "RpcError", "RaySystemError", "ConnectionError",
                               "GetTimeoutError"})


class WireError(ValueError):
    """An answer of a driver process the operator does not take; it names the field."""


# ---------------------------------------------------------------- child side

def encode(value: Any) -> Any:
    """The JSON form of an executor method's return value."""
    if isinstance(value, TrialUpdate):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {**fields, "state": value.state.value, "results": [r.to_wire() for r in value.results]}
    if isinstance(value, LaunchInfo):
        return dataclasses.asdict(value)
    if isinstance(value, ClusterResources):
        return {"total": value.total, "available": value.available,
                "nodes": [node._asdict() for node in value.nodes]}
    if isinstance(value, Resources):
        return value.to_ray()
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def encode_error(error: BaseException) -> dict:
    """An error raised by the executor: its type's name, message, and whether it means
    the cluster cannot be reached."""
    name = type(error).__name__
    unavailable = isinstance(error, (PlatformUnavailableError, ConnectionError)) or name in CONNECTION_ERRORS
    cause = getattr(error, "cause", None) if isinstance(error, PlatformUnavailableError) else None
    return {"error": name, "message": str(error)[:MAX_TEXT], "unavailable": unavailable,
            "cause": str(cause if cause is not None else f"{name}: {error}")[:MAX_TEXT]}


def envelope(call_id: int, ok: bool, value: Any) -> bytes:
    """One answer as the child sends it; a value that is not JSON becomes an error."""
    try:
        return json.dumps([call_id, ok, encode(value) if ok else encode_error(value)]).encode()
    except (TypeError, ValueError) as exc:
        error = ExecutorError(f"the Ray driver process answered what is not JSON: {type(exc).__name__}: {exc}")
        return json.dumps([call_id, False, encode_error(error)]).encode()


# ---------------------------------------------------------------- operator side

def read_envelope(data: bytes) -> tuple[int, bool, Any]:
    """``(call_id, ok, value)`` of one answer, value still to ``decode``."""
    if len(data) > MAX_ANSWER_BYTES:
        raise WireError(f"an answer of {len(data)} bytes, more than {MAX_ANSWER_BYTES}")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"an answer that is not JSON ({type(exc).__name__})") from None
    if not (isinstance(value, list) and len(value) == 3 and type(value[0]) is int and type(value[1]) is bool):
        raise WireError("an answer that is not [call id, ok, value]")
    return value[0], value[1], value[2]


def decode_error(value: Any, address: str, method: str = "") -> BaseException:
    """The error to raise for a failed ``method`` call (never of a type the child chose)."""
    if not isinstance(value, dict):
        raise WireError("error: must be an object")
    name = _text(value.get("error"), "error", 200)
    message = _text(value.get("message"), "message", MAX_TEXT)
    if _bool(value.get("unavailable"), "unavailable"):
        return RayUnavailableError(address, _text(value.get("cause"), "cause", MAX_TEXT) or message)
    if name == LaunchDeferred.__name__ and method == "start":    # not a failure: tried again
        return LaunchDeferred(message)
    return ExecutorError(f"{name}: {message}")


def decode(method: str, value: Any, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """The return value of ``method(*args, **kwargs)`` from its JSON form."""
    try:
        return _DECODERS[method](value, args, kwargs)
    except AnswerError as exc:        # checked.py's field checks
        raise WireError(str(exc)) from None
    except KeyError:
        raise WireError(f"an answer to {method!r}, which the operator does not call") from None


def _none(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
    if value is not None:
        raise WireError("must be null")


def _launch(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> LaunchInfo:
    obj = _object(value, "launch")
    key = args[0].trial_key
    if obj.get("trial_key") != key:
        raise WireError(f"trial_key: an answer to the launch of {key} must name it")
    return LaunchInfo(key, _text(obj.get("actor_name"), "actor_name", MAX_NAME), _bool(obj.get("attached"), "attached"),
                      _text(obj.get("placement_group"), "placement_group", MAX_NAME, optional=True))


def _poll(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, TrialUpdate]:
    asked = args[0]
    limit = kwargs.get("limit", 1000)
    # only the trials asked about: a driver process cannot speak for any other
    return {key: update(item, key, limit) for key, item in _object(value, "poll").items() if key in asked}


def _maybe_update(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> TrialUpdate | None:
    return None if value is None else update(value, args[0], limit=1 << 30)


def _trial_keys(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> list[str]:
    prefix = args[0] if args else ""
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise WireError(f"trial keys: must be a list of at most {MAX_ITEMS}")
    keys = [_text(key, "trial key", MAX_NAME) for key in value]
    if not all(key.startswith(prefix) for key in keys):
        raise WireError(f"trial keys: must all start with {prefix!r}")
    return keys


def _count(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> int:
    if type(value) is not int or not 0 <= value <= 1 << 62:
        raise WireError("count: must be an integer >= 0")
    return value


def _cluster(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> ClusterResources:
    obj = _object(value, "cluster resources")
    nodes = obj.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_ITEMS:
        raise WireError(f"nodes: must be a list of at most {MAX_ITEMS}")
    return ClusterResources(_amounts(obj.get("total"), "total"), _amounts(obj.get("available"), "available"),
                            [_node(node, f"nodes[{i}]") for i, node in enumerate(nodes)])


def _node(value: Any, field: str) -> NodeResources:
    obj = _object(value, field)
    return NodeResources(_text(obj.get("node_id"), f"{field}.node_id", MAX_NAME),
                         _text(obj.get("address"), f"{field}.address", MAX_NAME),
                         _amounts(obj.get("total"), f"{field}.total"),
                         _amounts(obj.get("available"), f"{field}.available"))


def _node_types(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> list[Resources] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise WireError(f"node types: must be a list of at most {MAX_ITEMS}")
    return [Resources.from_ray(_amounts(shape, f"node types[{i}]")) for i, shape in enumerate(value)]


def _logs(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> str:
    return _text(value, "logs", MAX_TEXT)


def _description(value: Any, args: tuple, kwargs: Mapping[str, Any]) -> dict | None:
    if value is None:
        return None
    answer = checked.description(value)
    if answer["trial_key"] != args[0]:
        raise WireError(f"description: an answer about {args[0]} must name it")
    return answer


_DECODERS: dict[str, Callable[[Any, tuple, Mapping[str, Any]], Any]] = {
    "connect": _none, "disconnect": _none, "request_resources": _none, "start": _launch, "poll": _poll,
    "stop": _maybe_update, "pause": _maybe_update, "list_trials": _trial_keys, "stop_all": _count,
    "remaining": _count, "cluster_resources": _cluster, "node_types": _node_types, "logs": _logs,
    "describe": _description}


def update(value: Any, key: str, limit: int) -> TrialUpdate:
    """One trial's ``TrialUpdate``, which must be about ``key``."""
    obj = _object(value, key)
    if obj.get("trial_key") != key:
        raise WireError(f"trial_key: an update for {key} must name it")
    try:
        state = TrialState(obj.get("state"))
    except ValueError:
        raise WireError(f"{key}: state must be one of {[s.value for s in TrialState]}") from None
    results = obj.get("results") or []
    if not isinstance(results, list) or len(results) > limit:
        raise WireError(f"{key}: results must be a list of at most {limit}")
    return TrialUpdate(
        key, state, tuple(Result.from_wire(checked.result(r, key, f"results[{i}]")) for i, r in enumerate(results)),
        error=_text(obj.get("error") or "", "error", MAX_TEXT),
        cluster_fault=_bool(obj.get("cluster_fault", False), "cluster_fault"),
        attempt=_int(obj.get("attempt"), "attempt"),
        checkpoint=checked.checkpoint(obj.get("checkpoint"), key, "checkpoint"),
        iteration=_int(obj.get("iteration"), "iteration"),
        waiting_reason=_text(obj.get("waiting_reason") or "", "waiting_reason", 200),
        waiting_message=_text(obj.get("waiting_message") or "", "waiting_message", 4000),
        awaiting_admission=_bool(obj.get("awaiting_admission", False), "awaiting_admission"),
        queue_full=_bool(obj.get("queue_full", False), "queue_full"),
        queue_wait_s=_seconds(obj.get("queue_wait_s"), "queue_wait_s", 1e9),
        evicted=_text(obj.get("evicted") or "", "evicted", 4000),
        run_started=_seconds(obj.get("run_started"), "run_started", 1e11),
        run_ended=_seconds(obj.get("run_ended"), "run_ended", 1e11))


def _object(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise WireError(f"{field}: must be an object")
    return value


def _text(value: Any, field: str, limit: int, *, optional: bool = False) -> str:
    if value is None and optional:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise WireError(f"{field}: must be a string of at most {limit} characters")
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise WireError(f"{field}: must be true or false")
    return value


def _int(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= 1 << 62:
        raise WireError(f"{field}: must be an integer >= 0 or null")
    return value


def _seconds(value: Any, field: str, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < high:
        raise WireError(f"{field}: must be a number of seconds in [0, {high:g}) or null")
    return float(value)


def _amounts(value: Any, field: str) -> dict[str, float]:
    obj = _object(value, field)
    if len(obj) > MAX_ITEMS:
        raise WireError(f"{field}: at most {MAX_ITEMS} resource kinds")
    for kind, amount in obj.items():
        if len(kind) > MAX_NAME or isinstance(amount, bool) or not isinstance(amount, (int, float)) \
                or not math.isfinite(amount) or amount < 0:
            raise WireError(f"{field}: {kind[:80]!r} must be a finite amount >= 0")
    return {kind: float(amount) for kind, amount in obj.items()}
