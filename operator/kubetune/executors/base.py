"""The executor seam: what the controller asks of whatever runs trials.

A trial is addressed by its key ``"<namespace>/<experiment>/<trial>"``.  Every
method is synchronous (the operator calls them in a thread) and safe to call from
several threads.  The behaviours follow Ray Tune's TrialExecutor and Syne Tune's
TrialBackend: start (optionally from a checkpoint, also another trial's), stop,
pause, fetch the results not seen yet (by sequence number), busy trials, logs.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Protocol

from kubetune.core.types import Result
from kubetune.spec.resources import TrialResources


class ExecutorError(RuntimeError):
    """Something only the executor's platform can cause went wrong."""


class PlatformUnavailableError(ExecutorError):
    """The platform cannot be reached; ``address`` and ``cause`` say which and why.  The
    controller keeps the trial and reconnects (``FailureKind.PLATFORM``)."""

    def __init__(self, address: str, cause: str, message: str = ""):
        super().__init__(message or f"{address!r} is unavailable: {cause}")
        self.address = address
        self.cause = cause

    def __reduce__(self):   # pickled from a driver process (executors/ray/process.py)
        return type(self), (self.address, self.cause)


class LaunchDeferred(ExecutorError):
    """The trial cannot be launched yet, and may be later: e.g. an actor of its Experiment
    has not said yet whether it hosts this trial already (a restarted operator's, still
    starting).  Neither the trial's fault nor the platform's: the launch stays queued and
    is tried again (controller/effects.py), the trial shown Queued with this message,
    cut to ``MESSAGE_CHARS`` (it may come from a driver process: driver_wire.py)."""

    MESSAGE_CHARS = 1000

    def __init__(self, message: str) -> None:
        super().__init__(str(message)[:self.MESSAGE_CHARS])


class TrialState(str, enum.Enum):
    RUNNING = "running"        # started or starting; more results may come
    COMPLETED = "completed"    # the function returned; every result was delivered
    FAILED = "failed"          # the function raised; ``error`` holds type, message, traceback
    STOPPED = "stopped"        # it ended at a report after stop()/pause() asked it to
    MISSING = "missing"        # its process is gone (worker or node died, Ray restarted)

    @property
    def is_terminal(self) -> bool:
        return self is not TrialState.RUNNING


@dataclass(frozen=True)
class LaunchRequest:
    trial_key: str                       # "<namespace>/<experiment>/<trial>"
    entrypoint: str                      # "package.module:function"
    config: Mapping[str, Any]
    resources: TrialResources = field(default_factory=TrialResources)   # one bundle's amounts x bundles
    checkpoint: str | None = None        # location to resume from (maybe another trial's)
    start_iteration: int = 0             # iterations already done; reports continue from +1
    start_seq: int = 0                   # last result seq already recorded; new ones follow it
    attempt: int = 0
    runtime_env: Mapping[str, Any] | None = None
    storage: str = ""                    # checkpoint storage root (path or URI)
    keep_last: int = 2
    keep_best: int = 0                   # with metric/mode: also keep the best N checkpoints
    metric: str | None = None
    mode: str = "min"
    pod_template: Mapping[str, Any] | None = None   # spec.trial.template (executor: pod)
    metrics_collector: str = "push"      # executor pod: push (HTTP) or stdout (the pod's log)
    queue: str | None = None             # executor pod: the Kueue LocalQueue (spec.queue)
    priority_class: str | None = None    # executor pod: the Kueue WorkloadPriorityClass

    def as_dict(self) -> dict[str, Any]:
        return {"trial_key": self.trial_key, "entrypoint": self.entrypoint,
                "config": dict(self.config), "checkpoint": self.checkpoint,
                "start_iteration": self.start_iteration, "start_seq": self.start_seq,
                "attempt": self.attempt, "storage": self.storage, "keep_last": self.keep_last,
                "keep_best": self.keep_best, "metric": self.metric, "mode": self.mode}


@dataclass(frozen=True)
class LaunchInfo:
    trial_key: str
    actor_name: str                      # the named Ray actor hosting the trial
    attached: bool                       # True: it was already running; nothing new started
    placement_group: str | None = None


@dataclass(frozen=True)
class TrialUpdate:
    """What happened to one trial since the cursor the controller gave."""
    trial_key: str
    state: TrialState
    results: tuple[Result, ...] = ()     # seq > cursor, in order
    error: str = ""                      # FAILED: "{ExcType}: {msg}\n{traceback tail}"; MISSING: cause
    cluster_fault: bool = False          # MISSING because of the cluster (node lost, Ray restarted)
    attempt: int | None = None
    checkpoint: str | None = None        # latest persisted checkpoint of this attempt, if any
    iteration: int | None = None         # latest reported iteration
    # RUNNING as far as the runner goes (it holds its slot), but the platform has not started
    # it yet, e.g. a pod the kube-scheduler cannot place: shown as Queued with this reason
    waiting_reason: str = ""
    waiting_message: str = ""
    # a platform admission queue (core/admission.py; Kueue: executors/pods/kueue.py):
    # ``awaiting_admission`` while its pod waits for admission
    # (waiting_reason says Queued or Provisioning; ``queue_full`` if Kueue found no quota
    # for it); ``queue_wait_s`` once admitted; ``evicted`` (Preempted, Evicted) with
    # MISSING when Kueue took the pod away
    awaiting_admission: bool = False
    queue_full: bool = False
    queue_wait_s: float | None = None
    evicted: str = ""
    # the attempt's run on the trial host's own clock (epoch seconds): when its function
    # started and when it ended (None while it runs); what the usage ledger counts
    # (core/usage.py), so no operator clock or restart enters it
    run_started: float | None = None
    run_ended: float | None = None


class NodeResources(NamedTuple):
    node_id: str
    address: str
    total: dict[str, float]
    available: dict[str, float]


class ClusterResources(NamedTuple):
    total: dict[str, float]
    available: dict[str, float]
    nodes: list[NodeResources]


class TrialExecutor(Protocol):
    def connect(self) -> None: ...
    def disconnect(self) -> None: ...
    def is_unavailable(self, error: BaseException) -> bool:
        """True when ``error`` (raised by a method here) means the platform cannot be
        reached: its ``Platform`` classifies it as the platform's fault (executors/platform.py)."""
    def start(self, req: LaunchRequest) -> LaunchInfo: ...
    def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0,
             limit: int = 1000) -> dict[str, TrialUpdate]: ...
    def stop(self, trial_key: str, *, after_seq: int | None = None,
             timeout_s: float = 5.0) -> TrialUpdate | None: ...
    def pause(self, trial_key: str, *, after_seq: int | None = None,
              timeout_s: float = 30.0) -> TrialUpdate | None: ...
    def list_trials(self, prefix: str = "") -> list[str]: ...
    def stop_all(self, prefix: str) -> int: ...
    def cluster_resources(self) -> ClusterResources: ...
    def logs(self, trial_key: str, lines: int = 200) -> str: ...
    def describe(self, trial_key: str) -> dict | None: ...
    def request_resources(self, bundles: list[dict[str, float]]) -> None: ...
