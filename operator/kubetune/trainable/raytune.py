"""Ray Tune's trial API, served by kubetune (issue 29): a Ray Tune function or
``tune.Trainable`` runs as a kubetune trial with no edit.

What the trial's code calls, and where it lands:

- ``ray.tune.report(metrics, checkpoint=...)``, ``ray.air.session.report`` and
  ``ray.train.report`` (Ray sends the last two to ``ray.tune.report`` inside a Tune
  trial) -> ``kubetune.report``, with Ray's auto-filled fields added
  (``training_iteration``, ``time_this_iter_s``, ``time_total_s``, ...; see
  ``auto_filled``); a result with ``done: True`` ends the trial as finished;
- ``ray.tune.get_checkpoint()`` -> ``kubetune.get_checkpoint()`` as a ``ray.tune.Checkpoint``;
- ``ray.tune.get_context()`` -> the trial's id and name (the Trial's name), experiment,
  a local trial directory and its resources;
- a ``ray.tune.Checkpoint`` handed to report is read from where it is: a local
  directory as it is, an ``s3://``/``gs://`` one copied through kubetune's checkpoint
  storage (fsspec) first.

Ray finds the session through one private global, set in ``ray_private.py``; the
session object here is process-wide and hands each call to the kubetune session of
the calling thread, so two trials in one process never mix (api.py).  What reaches
kubetune is plain JSON-able metrics and a directory: nothing of Ray crosses to the
operator.

``ray.train.report`` under Ray Train V2 (the default since Ray 2.50) refuses to run
inside a Tune trial; a trial process therefore imports Ray Train as V1
(``RAY_TRAIN_V2_ENABLED=0``) unless the user set that variable, so code written for
Ray < 2.50 keeps working.  The legacy ``tune.report(**metrics)`` is gone from Ray
2.x itself (it takes one dict): there is nothing to serve.
"""
from __future__ import annotations

import inspect
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kubetune.trainable import api, ray_private

RAY_TRAIN_V2_ENV = "RAY_TRAIN_V2_ENABLED"
# pyarrow's file system names -> the URI scheme fsspec reads them with
_SCHEMES = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs"}


@dataclass
class _TrialClock:
    """Per-attempt bookkeeping behind the auto-filled fields."""
    started: float
    last: float
    reports: int = 0
    restored: Any = None            # the ray Checkpoint handed out by get_checkpoint()


_clocks: "weakref.WeakKeyDictionary[Any, _TrialClock]" = weakref.WeakKeyDictionary()
_clocks_lock = threading.Lock()


def _clock(session: Any) -> _TrialClock:
    with _clocks_lock:
        clock = _clocks.get(session)
        if clock is None:
            started = getattr(session, "started_at", None) or time.time()   # the attempt's start
            clock = _clocks[session] = _TrialClock(started=started, last=started)
        return clock


def _kubetune_session(what: str) -> api.Session:
    return api._require(what)


def auto_filled(context: api.TrialContext, clock: _TrialClock, now: float) -> dict[str, Any]:
    """The fields Ray adds to every result.  ``training_iteration`` is kubetune's
    iteration (both count reports, across restores), so a scheduler's time attribute
    means the same; the times count this attempt (a restored Ray trial carries
    ``time_total_s`` over, kubetune does not know it)."""
    return {"training_iteration": context.iteration + 1,
            "iterations_since_restore": clock.reports + 1,
            "time_this_iter_s": now - clock.last,
            "time_total_s": now - clock.started,
            "time_since_restore": now - clock.started,
            "timestamp": int(now),
            "trial_id": context.trial_name,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "done": False}


def report_result(metrics: Mapping[str, Any], checkpoint_dir: str | None) -> None:
    """One Ray-style result: the auto-filled fields under the trial's own; ``done``
    (set by the trial) ends the trial as finished after this result."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"ray.tune.report() takes a dict of metrics, got {type(metrics).__name__}")
    session = _kubetune_session("report")
    clock = _clock(session)
    now = time.time()
    result = {**auto_filled(session.get_context(), clock, now), **metrics}
    session.report(result, checkpoint_dir)
    clock.last, clock.reports = now, clock.reports + 1
    if result.get("done") is True:
        raise api.TrialDone()


class RayTuneSession:
    """What Ray's trial API calls in a kubetune trial (the duck type of Ray's
    ``_TrainSession`` that ``ray.tune.report`` & co. use)."""

    kubetune = True            # ray_private.install_session: this one may be replaced
    world_rank = None          # None: "a Tune trial, not a Train worker" (Ray's own test)
    local_rank = None
    node_rank = None
    world_size = 1
    local_world_size = 1
    metadata: dict = {}
    accelerator = None
    storage = None

    # ---------------------------------------------------------------- called by Ray's API

    def report(self, metrics: Mapping[str, Any], checkpoint: Any = None, **_ignored: Any) -> None:
        local, cleanup = _local_checkpoint(checkpoint)
        try:
            report_result(metrics, local)
        finally:
            if cleanup:
                shutil.rmtree(cleanup, ignore_errors=True)

    @property
    def loaded_checkpoint(self) -> Any:
        session = _kubetune_session("get_checkpoint")
        clock = _clock(session)
        if clock.restored is None:
            directory = session.get_checkpoint()
            if directory is None:
                return None
            from ray.tune import Checkpoint
            clock.restored = Checkpoint.from_directory(directory)
        return clock.restored

    @property
    def trial_id(self) -> str:
        return _kubetune_session("get_context").get_context().trial_name

    trial_name = trial_id

    @property
    def experiment_name(self) -> str:
        return _kubetune_session("get_context").get_context().experiment

    @property
    def run_id(self) -> str:
        context = _kubetune_session("get_context").get_context()
        return f"{context.trial_key}/{context.attempt}"

    @property
    def trial_dir(self) -> str:
        context = _kubetune_session("get_context").get_context()
        path = os.path.join(tempfile.gettempdir(), "kubetune-trials", context.namespace,
                            context.experiment, context.trial_name)
        os.makedirs(path, exist_ok=True)
        return path

    @property
    def trial_resources(self) -> Any:
        from ray.tune.execution.placement_groups import PlacementGroupFactory
        return PlacementGroupFactory([_resources()])

    def get_dataset_shard(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def _resources() -> dict[str, float]:
    """What this trial may use: Ray's assignment inside a Ray worker, else the CPUs the
    process may run on (a trial pod's own limits are not visible to it otherwise)."""
    try:
        import ray
        if ray.is_initialized():
            assigned = ray.get_runtime_context().get_assigned_resources()
            if assigned:
                return {k: float(v) for k, v in assigned.items() if v}
    except Exception:  # noqa: BLE001 - no Ray worker: fall through
        pass
    return {"CPU": float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)}


def _local_checkpoint(checkpoint: Any) -> tuple[str | None, str | None]:
    """A local directory holding ``checkpoint`` (a ray Checkpoint, a path, or None), and
    a temporary copy to delete after the report (None when it is the user's own)."""
    if checkpoint is None:
        return None, None
    path, filesystem = getattr(checkpoint, "path", None), getattr(checkpoint, "filesystem", None)
    if path is None and isinstance(checkpoint, (str, os.PathLike)):
        return os.fspath(checkpoint), None
    if path is None:
        raise TypeError(f"ray.tune.report(checkpoint=...) takes a ray.tune.Checkpoint or a "
                        f"directory, got {type(checkpoint).__name__}")
    kind = getattr(filesystem, "type_name", "local")
    if kind == "local":
        return path, None
    from kubetune.checkpoints.storage import materialize
    scheme = _SCHEMES.get(kind, kind)
    local = materialize(f"{scheme}://{path}")
    return local, os.path.dirname(local)


_session = RayTuneSession()


def _install(module: Any = None) -> None:
    ray_private.install_session(_session)


def serve_ray_api() -> None:
    """Before the trial's code is imported: serve Ray Tune's API to it in this process,
    now if Ray's session module is loaded, else the moment it is."""
    if "ray.train" not in sys.modules:
        os.environ.setdefault(RAY_TRAIN_V2_ENV, "0")
    ray_private.when_session_module_loads(_install)


def adapt(target: Callable[..., Any]) -> Callable[..., Any]:
    """The function kubetune calls for an entrypoint: a ``tune.Trainable`` class is run
    by trainable/raytune_class.py; a function (also one wrapped by ``tune.with_parameters``
    or ``tune.with_resources``) is called as it is."""
    if inspect.isclass(target) and ray_private.uses_ray_api():
        from ray.tune import Trainable
        if issubclass(target, Trainable):
            from kubetune.trainable.raytune_class import trainable_class_runner
            return trainable_class_runner(target)
    return target
