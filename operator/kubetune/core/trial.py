"""The runner's view of one trial. Mutable, owned by ``TrialRunner``; schedulers and
the controller read it (``TrialRunner.trials``) and never change it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kubetune.core.curve import add_point
from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.core.usage import TrialUsage


# PBT exploits listed on a Trial: the latest (the last one says what it runs with)
KEPT_LINEAGE = 20


@dataclass
class TrialInfo:
    name: str
    index: int
    params: dict[str, Any]                     # what it runs with (PBT: the explored ones)
    phase: TrialPhase = TrialPhase.PENDING
    suggested_params: dict[str, Any] | None = None   # what the search suggested (Trial spec)
    reason: str = ""
    message: str = ""
    iteration: int = 0                         # last reported (1-based; 0 = nothing yet)
    history: list[Mapping[str, Any]] = field(default_factory=list)   # the curve (core/curve.py)
    history_stride: int = 1                    # iterations between points of the curve
    last_metrics: Mapping[str, Any] | None = None
    last_value: float | None = None            # objective in the last result
    latest: dict[str, float] = field(default_factory=dict)  # last value of each objective/constraint metric
    infeasible: str = ""                       # why its results break spec.constraints ("" if they do not)
    best_value: float | None = None            # best objective reported so far
    best_iteration: int | None = None
    checkpoint: str | None = None              # latest persisted checkpoint
    checkpoint_iteration: int = 0              # the iteration that checkpoint holds
    attempt: int = 0                           # launches so far minus one
    failures: int = 0                          # errors that counted against maxFailures
    failure_log: list[dict[str, Any]] = field(default_factory=list)  # {attempt, reason, message, time}
    parent: str | None = None                  # PBT: trial whose checkpoint was cloned
    lineage: list[dict[str, Any]] = field(default_factory=list)      # PBT {iteration, from, params}
    last_seq: int = -1                         # seq of the last result recorded
    launched: bool = False                     # has run at least once (a relaunch is a new attempt)
    relaunch: bool = False                     # Paused, and should run again when it can
    queued_since: float | None = None
    start_time: float | None = None
    attempt_start: float | None = None         # when the current run was launched (trial.timeout)
    launch_deferred: bool = False              # its launch is waiting on the platform (LaunchDeferred)
    completion_time: float | None = None
    # a platform queue (spec.queue): seconds it waited for admission, over how many
    # admissions, and how often the queue evicted (preempted) it
    queue_wait_s: float = 0.0
    queue_waits: int = 0
    evictions: int = 0
    admitted_attempt: int | None = None        # the attempt the queue admitted last
    usage: TrialUsage = field(default_factory=TrialUsage)   # run/GPU/CPU/queue seconds (core/usage.py)

    @property
    def launchable(self) -> bool:
        return self.phase in (TrialPhase.PENDING, TrialPhase.QUEUED) or (
            self.phase is TrialPhase.PAUSED and self.relaunch)

    @property
    def resuming(self) -> bool:
        """It ran before: a retry, an unpause or a PBT exploit (it starts from a checkpoint)."""
        return self.attempt > 0 or self.checkpoint is not None or self.iteration > 0

    def ended(self, reason: str, message: str, now: float | None) -> None:
        """It became terminal (TrialRunner._end): why, and when.  A run adopted after a
        restart whose launch time was never written (a deferred launch that went out just
        before) starts when its host said it did, if it ran."""
        self.reason, self.message, self.completion_time, self.relaunch = reason, message, now, False
        self.queued_since = None
        if self.start_time is None:
            self.start_time = self.usage.first_start()


def from_record(record: TrialRecord, *, suspended: bool) -> TrialInfo:
    """A trial rebuilt from its persisted Trial after a restart (the runner adds its values:
    runner.restore).  A full old history is thinned into a curve; a curve stays as it is."""
    history: list[Mapping[str, Any]] = []
    stride = record.history_stride
    for point in record.history:    # already a curve: unchanged; a full old history: thinned
        history, stride = add_point(history, stride, dict(point))
    iteration = record.iteration
    if iteration is None:
        iteration = history[-1].get("iteration", len(history)) if history else 0
    last_metrics = dict(record.last_metrics) if record.last_metrics is not None else \
        history[-1] if history else None
    trial = TrialInfo(
        name=record.name, index=record.index, phase=record.phase,
        params=dict(record.lineage[-1]["params"]) if record.lineage else dict(record.params),
        suggested_params=dict(record.params),
        reason=record.reason, message=record.message, iteration=iteration, history=history,
        history_stride=stride, last_metrics=last_metrics, checkpoint=record.checkpoint,
        checkpoint_iteration=(record.checkpoint_iteration if record.checkpoint_iteration is not None
                              else iteration if record.checkpoint else 0),
        attempt=record.attempt, failures=record.failures, parent=record.parent,
        failure_log=[dict(entry) for entry in record.failure_log],
        lineage=[dict(entry) for entry in record.lineage],
        start_time=record.start_time if record.start_time is not None else _started_by(record),
        completion_time=record.completion_time,
        # suspended meanwhile: the wait starts again when it is resumed (as _suspend does)
        queued_since=record.queued_since if record.phase is TrialPhase.QUEUED and not suspended else None,
        attempt_start=record.attempt_start, queue_wait_s=record.queue_wait_s, queue_waits=record.queue_waits,
        evictions=record.evictions, usage=TrialUsage.from_status(record.usage),
        last_seq=record.last_result_seq if record.last_result_seq is not None else len(history) - 1)
    trial.launched = record.phase not in (TrialPhase.PENDING, TrialPhase.QUEUED) or record.attempt > 0 or bool(history)
    trial.relaunch = record.phase is TrialPhase.PAUSED and not suspended
    return trial


def _started_by(record: TrialRecord) -> float | None:
    """When a Trial persisted Running without status.startTime started: its current run's
    launch (attemptStartTime; no earlier run went out, or its start would be written).  The
    operator stopped between the launch and the status write that records it; the
    restarted one adopts the run, and without this wrote the Trial's end with no start.
    A run whose launch time was not kept either (a deferred launch) gets the start its
    host reported when it ends (TrialInfo.ended)."""
    return record.attempt_start if record.phase is TrialPhase.RUNNING else None
