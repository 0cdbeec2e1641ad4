"""A trial's Ray actor and its answers, read without unpickling anything (issue 25, N1).

Both ends of the one channel between a trial's process and the operator: the actor
class a worker runs (``RayTrialHost``, at the end), whose every method answers here,
and the operator's side that calls it and reads the answers.  A worker process imports
this module, so it imports only Ray and ``kubetune.trainable`` (the rest of
``executors.ray`` pulls in the core, Optuna and NumPy: 0.2-0.6 s of CPU per worker
start on a 2-core machine).

A trial actor's process runs the user's code (trainable/host.py runs the function in
a thread), so whatever that process hands back is the tenant's: it can replace any
method or patch Ray's serializer.  ``ray.get`` of an actor call's result unpickles it
in the caller, and so does ``ray.get`` of its error (a ``RayTaskError`` is a pickle),
so the operator never ``ray.get``s an actor call.  Instead:

- the operator names a key in Ray's internal key-value store (the GCS) for each call
  (``call``); the actor writes its answer there as JSON text (``answer``) and returns
  nothing;
- the operator waits for the call with ``ray.wait`` (which reads no value), then reads
  the key's raw bytes itself (``read``): at most ``MAX_ANSWER_BYTES``, ``json.loads``
  only, and the caller validates the shape before using it (checked.py, by the executor and discovery.py);
- a call that wrote no answer failed: how is told by the Ray error's *type*, read from
  the object's metadata, and by the error's protobuf (the text Ray's core worker wrote),
  never by unpickling the exception.  Through Ray Client there is no metadata to read:
  the failure is then "died" with a generic message.

What this does not protect: a trial can write any key of the store, so within one Ray
cluster a trial can forge another trial's answers (validated and bounded as any answer,
so never code in the operator).  A Ray cluster shared by tenants is one trust domain
(README: Security).
"""
from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import Any

import ray
from ray.experimental import internal_kv

from kubetune.executors.ray import ray_compat
from kubetune.trainable.host import TrialHost

# A fetch batch is cut at FETCH_BATCH_BYTES of results (function_runner.py), plus one
# result (MAX_RESULT_BYTES) and a traceback (1 Mi characters, up to 6 bytes each escaped)
MAX_ANSWER_BYTES = 32 << 20
INVALID = "kubetune-invalid-answer"   # the actor could not encode its answer as JSON
MESSAGE_CHARS = 2000

# Ray error types (ray.core.generated.common_pb2.ErrorType) by what they mean for a trial
_CLUSTER = {"NODE_DIED", "LOCAL_RAYLET_DIED", "OBJECT_LOST", "OWNER_DIED", "OBJECT_FETCH_TIMED_OUT"}
_UNAVAILABLE = {"ACTOR_UNAVAILABLE"}
_RUNTIME_ENV = {"RUNTIME_ENV_SETUP_FAILED"}


class AnswerError(Exception):
    """An actor call that gave no valid answer.  ``kind``: ``rejected`` (an answer that is
    not kubetune's, from a trial's process), ``raised`` (the method raised), ``died``,
    ``cluster`` (a node or Ray itself failed), ``unavailable`` (for now), ``runtime_env``."""

    def __init__(self, kind: str, message: str):
        super().__init__(message[:MESSAGE_CHARS])
        self.kind = kind


@dataclass
class Call:
    """An actor call in flight: its ObjectRef (never ``ray.get``) and its answer's key."""
    ref: Any
    namespace: str
    key: str


def call(method: Any, namespace: str, *args: Any, **kwargs: Any) -> Call:
    """``method.remote(answer_to, *args, **kwargs)`` with a fresh answer key."""
    key = f"answer/{uuid.uuid4().hex}"
    return Call(method.remote([namespace, key], *args, **kwargs), namespace, key)


def answer(answer_to: Any, value: Any) -> None:
    """Actor side: write ``value`` as JSON where the operator asked for it."""
    namespace, key = answer_to
    try:
        data = json.dumps(value)
    except (TypeError, ValueError) as exc:
        data = json.dumps({INVALID: f"{type(exc).__name__}: {exc}"[:MESSAGE_CHARS]})
    internal_kv._internal_kv_put(key, data.encode(), overwrite=True, namespace=namespace)


def ready(calls: list[Call], timeout_s: float, num_returns: int | None = None) -> set[Any]:
    """The refs of ``calls`` that finished (``ray.wait``: no value is read)."""
    refs = [c.ref for c in calls]
    if not refs:
        return set()
    done, _ = ray.wait(refs, num_returns=num_returns or len(refs), timeout=timeout_s)
    return set(done)


def read(done: Call) -> Any:
    """The JSON answer of a finished call; raises ``AnswerError``."""
    raw = internal_kv._internal_kv_get(done.key, namespace=done.namespace)
    if raw is None:
        raise failure(done.ref)
    internal_kv._internal_kv_del(done.key, namespace=done.namespace)
    return decode(raw)


def decode(raw: bytes) -> Any:
    """Bounded JSON; anything else is ``rejected``."""
    if len(raw) > MAX_ANSWER_BYTES:
        raise AnswerError("rejected", f"the trial's actor answered {len(raw)} bytes, more than the "
                                      f"{MAX_ANSWER_BYTES} an answer may hold")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AnswerError("rejected", f"the trial's actor answered what is not JSON ({type(exc).__name__}: "
                                      f"{str(exc)[:200]})") from None
    if isinstance(value, dict) and INVALID in value:
        raise AnswerError("rejected", f"the trial's actor answered what is not JSON: {str(value[INVALID])[:500]}")
    return value


def failure(ref: Any) -> AnswerError:
    """Why a finished call wrote no answer, from its Ray error's type (no unpickling)."""
    try:
        data, metadata = ray_compat.stored_object(ref)
    except Exception:  # noqa: BLE001 - Ray Client has no core worker here: the type is unknown
        return AnswerError("died", "the trial's Ray actor gave no answer (it died or its call failed)")
    code = metadata.split(b",")[0]
    if not code.isdigit():
        # a value (pickled or raw) instead of an answer: the trial replaced kubetune's code
        return AnswerError("rejected", "the trial's actor returned a value instead of kubetune's JSON answer "
                                       f"(Ray metadata {code[:20]!r}); it was not read")
    from ray.core.generated.common_pb2 import ErrorType
    try:
        name = ErrorType.Name(int(code))
    except ValueError:
        name = f"ERROR_{int(code)}"
    text, preempted = _error_text(data, code)
    detail = f"Ray error {name}" + (f": {text}" if text else "")
    if name in _RUNTIME_ENV:
        return AnswerError("runtime_env", f"runtime_env setup failed: {detail}")
    if name in _CLUSTER or preempted or "node has died" in text:
        return AnswerError("cluster", f"the trial's Ray node or Ray itself failed ({detail})")
    if name in _UNAVAILABLE:
        return AnswerError("unavailable", detail)
    if name == "TASK_EXECUTION_EXCEPTION":
        # the exception is a pickle made in the trial's process: its text is not read
        return AnswerError("raised", "the trial's actor raised in a kubetune call; the exception came from "
                                     "the trial's process and was not read")
    return AnswerError("died", f"the trial's Ray actor died ({detail})")


def _error_text(data: Any, code: bytes) -> tuple[str, bool]:
    """The message of a Ray system error: msgpack + protobuf written by Ray's core worker
    (for a non-Python metadata Ray's reader skips the pickle part, so this never unpickles)."""
    if not data:
        return "", False
    try:
        info = ray_compat.error_info(data, code)
    except Exception:  # noqa: BLE001 - no error info (ACTOR_DIED without details, ...)
        return "", False
    preempted, text = False, str(info.error_message)
    if info.HasField("actor_died_error") and info.actor_died_error.HasField("actor_died_error_context"):
        cause = info.actor_died_error.actor_died_error_context
        text = text or str(cause.error_message)
        try:
            from ray.core.generated.common_pb2 import NodeDeathInfo
            preempted = cause.HasField("node_death_info") and \
                cause.node_death_info.reason == NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
        except Exception:  # noqa: BLE001 - an older or newer protobuf: not preempted
            preempted = False
    return text[:MESSAGE_CHARS], preempted


def forget(namespace: str) -> None:
    """Drop the answers nobody read under a Ray namespace (its actors were killed)."""
    try:
        internal_kv._internal_kv_del("answer/", del_by_prefix=True, namespace=namespace)
    except Exception:  # noqa: BLE001 - best effort: they hold a few bytes each
        pass


# ---------------------------------------------------------------- the actor

class RayTrialHost(TrialHost):
    def __init__(self, name: str, pool_key: str, shape: dict, launch: dict | None,
                 idle_timeout_s: float, orphan_timeout_s: float, lease_timeout_s: float = 0.0):
        context = ray.get_runtime_context()
        super().__init__(name, pool_key, info={"node_id": context.get_node_id(), "shape": shape},
                         idle_timeout_s=idle_timeout_s, orphan_timeout_s=orphan_timeout_s,
                         on_idle=self._exit, lease_timeout_s=lease_timeout_s)
        if launch is not None:     # creation and first assignment in one step: no orphan window
            TrialHost.assign(self, launch)

    def assign(self, answer_to, launch: dict) -> None:
        answer(answer_to, TrialHost.assign(self, launch))

    def fetch(self, answer_to, trial_key: str, after_seq: int, limit: int = 1000, wait_s: float = 0.0) -> None:
        answer(answer_to, TrialHost.fetch(self, trial_key, after_seq, limit, wait_s))

    def stop(self, answer_to, trial_key: str, timeout_s: float = 5.0, after_seq: int | None = None,
             at_checkpoint: bool = False) -> None:
        answer(answer_to, TrialHost.stop(self, trial_key, timeout_s, after_seq, at_checkpoint))

    def release(self, answer_to, trial_key: str) -> None:
        answer(answer_to, TrialHost.release(self, trial_key))

    def describe(self, answer_to) -> None:
        answer(answer_to, TrialHost.describe(self))

    def logs(self, answer_to, trial_key: str, lines: int = 200) -> None:
        answer(answer_to, TrialHost.logs(self, trial_key, lines))

    def _exit(self) -> None:
        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        except Exception:  # noqa: BLE001 - leave one way or another
            os._exit(0)


HostActor = ray.remote(RayTrialHost)
