"""The vocabulary shared by the runner, the controller and the executors.

Events flow into ``core.runner.TrialRunner`` as method calls; what it wants done
comes back as a list of ``Decision`` values, which the controller carries out in
order (create the Trial resource, launch, stop, ...).  Nothing here does I/O.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubetune.spec.results import Result  # noqa: F401  (the typed result, defined with its wire format)


class TrialPhase(str, enum.Enum):
    PENDING = "Pending"      # created (Trial resource exists), not yet launched
    QUEUED = "Queued"        # wants to run, its resources are not free yet
    RUNNING = "Running"
    PAUSED = "Paused"        # checkpointed and off the cluster (PBT, suspend)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"      # ended by a decision: early stopping, deletion, budget

    @property
    def is_terminal(self) -> bool:
        return self in (TrialPhase.SUCCEEDED, TrialPhase.FAILED, TrialPhase.STOPPED)


@dataclass(frozen=True)
class TrialRecord:
    """What a Trial resource persists; enough to rebuild the runner after a restart."""
    name: str
    index: int
    params: Mapping[str, Any]
    phase: TrialPhase
    history: tuple[Mapping[str, Any], ...] = ()   # every reported metrics dict, in order
    checkpoint: str | None = None                 # latest persisted checkpoint
    failures: int = 0
    reason: str = ""
    message: str = ""
    parent: str | None = None                     # PBT: trial whose checkpoint was cloned
    # Added by the core (all optional, so older callers keep working):
    attempt: int = 0                              # launches so far minus one
    iteration: int | None = None                  # last reported; None -> from history
    last_result_seq: int | None = None            # None -> len(history) - 1 (seqs from 0)
    checkpoint_iteration: int | None = None       # iteration of ``checkpoint``; None -> iteration
    lineage: tuple[Mapping[str, Any], ...] = ()   # PBT: {iteration, from, params} per exploit
    # each failure {attempt, reason, message, time (epoch seconds)}; ``failures`` counts
    # those that count against maxFailures
    failure_log: tuple[Mapping[str, Any], ...] = ()
    attempt_start: float | None = None            # when the current run started (trial.timeout)
    # status.startTime and completionTime: restored, or a Trial running across a restart was
    # written without its start once it ended, and a finished one rewritten lost its end
    start_time: float | None = None
    completion_time: float | None = None
    # status.queuedSince: when it began waiting for resources (spec.trial.queueTimeout counts
    # from it, and usage.queueSeconds counts the wait when it starts), across restarts
    queued_since: float | None = None
    # the latest value of each objective and constraint metric (TrialInfo.latest): kept
    # whole while the history may be downsampled
    latest_metrics: Mapping[str, float] | None = None
    # The bounded status (issue 14): the curve is downsampled (core/curve.py), so the
    # values below are persisted rather than derived from the history.
    history_stride: int = 1
    last_metrics: Mapping[str, Any] | None = None
    last_value: float | None = None               # objective in the last result (may be NaN)
    best_value: float | None = None               # best finite objective
    best_iteration: int | None = None
    decision_state: Mapping[str, Any] | None = None   # TrialRunner.decision_state
    queue_wait_s: float = 0.0                     # spec.queue: seconds waited for admission, all attempts
    queue_waits: int = 0                          # spec.queue: admissions
    evictions: int = 0                            # spec.queue: evictions (preemptions)
    usage: Mapping[str, Any] | None = None        # Trial.status.usage (core/usage.TrialUsage.to_status)


# ---------------------------------------------------------------- decisions

@dataclass(frozen=True)
class CreateTrial:
    """Persist a new Trial resource (before anything is launched for it)."""
    name: str
    index: int
    params: Mapping[str, Any]


@dataclass(frozen=True)
class LaunchTrial:
    """Start (or restart) the trial; its resources are already committed in the ledger.

    ``start_iteration`` is the iteration count already reached (0 for a fresh start),
    so a retry or resume continues counting rather than restarting at 1.
    """
    name: str
    params: Mapping[str, Any]
    checkpoint: str | None = None
    start_iteration: int = 0
    attempt: int = 0
    # The last result seq already recorded (-1: none); the new run numbers its results
    # from last_result_seq + 1 so nothing it reports is mistaken for a duplicate.
    last_result_seq: int = -1


@dataclass(frozen=True)
class StopTrial:
    """End a trial and release its resources; ``phase`` is the terminal phase to record."""
    name: str
    phase: TrialPhase
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PauseTrial:
    """Take a running trial off the cluster, keeping its latest checkpoint.  With
    ``clone_from`` (a PBT exploit) it continues from that trial's checkpoint instead."""
    name: str
    reason: str
    message: str = ""
    clone_from: str | None = None


@dataclass(frozen=True)
class TrialPhaseChanged:
    """A non-terminal phase change to write back (e.g. Pending -> Queued with a reason)."""
    name: str
    phase: TrialPhase
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class FinishExperiment:
    """The experiment is over: ``phase`` is Succeeded or Failed."""
    phase: str
    reason: str       # GoalReached, MaxTrialsReached, SearchSpaceExhausted, MaxFailedTrials, ...
    message: str


Decision = CreateTrial | LaunchTrial | StopTrial | PauseTrial | TrialPhaseChanged | FinishExperiment


@dataclass
class ExperimentSummary:
    """Fixed-size status of an experiment: never grows with its number of trials."""
    counts: dict[str, int] = field(default_factory=dict)   # phase value -> count
    created: int = 0
    best_trial: str | None = None
    best_params: Mapping[str, Any] | None = None
    best_metric: float | None = None
    best_iteration: int | None = None
    queue_reason: str = ""
    finished: FinishExperiment | None = None
    max_trials: int = 0                                     # for progress: done/max_trials
    outcomes: Any = None    # core.pareto.Outcomes: Pareto front, hypervolume, reused and warm-start trials
    admissions: Mapping[str, Any] | None = None   # admissions, queue wait, evictions (spec.queue); None without
    usage: Mapping[str, float] | None = None   # Experiment.status.usage (core/usage.experiment_usage)
