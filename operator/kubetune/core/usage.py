"""The ledger of what a trial used: run, GPU and CPU seconds over every attempt, and the
seconds it waited to run.

Run time is counted from the trial host's own clock: the host says when the attempt's
function started and when it ended (or the latest time it has seen), so an operator
restarted while the trial runs counts the attempt once and exactly (the host reports
the same start again), and the operator's own clock, queueing and polling delays never
enter it.  An attempt is closed when a later attempt appears or its end is seen; a
closed attempt is never counted again.  Queue time is the operator's (nothing runs
yet): Queued for resources or the autoscaler, plus the queue's admission wait.  Pure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


KEPT_ENDED_RUNS = 3


@dataclass
class AttemptRun:
    attempt: int
    started: float            # host clock, epoch seconds
    seen: float               # the latest host time known for it (its end, once it ended)
    gpus: float
    cpus: float
    ended: bool = False
    queued: float = 0.0       # seconds it waited to run before it started (operator's clock)

    def to_status(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "startedAt": self.started, "seenAt": self.seen, "gpus": self.gpus,
                "cpus": self.cpus, "queuedSeconds": round(self.queued, 3)}

    @property
    def seconds(self) -> float:
        return max(self.seen - self.started, 0.0)


@dataclass
class TrialUsage:
    run_s: float = 0.0        # closed attempts
    gpu_s: float = 0.0
    cpu_s: float = 0.0
    queue_s: float = 0.0      # Queued (resources, autoscaler); admission waits are TrialInfo.queue_wait_s
    counted_through: int = -1                # attempts up to this one are closed
    current: AttemptRun | None = None
    # the latest ended attempts, shown in the status so the results store gets each one's
    # final row even when two end between status writes (a retry that fails at once)
    ended_runs: list[AttemptRun] = field(default_factory=list)
    waiting_s: float = 0.0                   # queued since the last attempt started

    def add_queue(self, seconds: float) -> None:
        self.queue_s += seconds
        self.waiting_s += seconds

    def observe(self, attempt: int, started: float | None, seen: float | None, *, gpus: float, cpus: float,
                ended: bool = False) -> bool:
        """What the host said about ``attempt``: when it started, the latest time it saw
        and whether it ended.  True when the ledger changed."""
        if attempt <= self.counted_through or started is None:
            return False
        current = self.current
        if current is not None and current.attempt != attempt:
            if current.attempt > attempt:
                return False       # an older attempt's late answer
            self._close()
        if self.current is None:
            self.current = AttemptRun(attempt, started, max(started, seen or started), gpus, cpus,
                                      queued=self.waiting_s)
            self.waiting_s = 0.0
            changed = True
        else:
            changed = seen is not None and seen > self.current.seen
            if changed:
                self.current.seen = seen
        if ended:
            self._close()
            changed = True
        return changed

    def saw(self, attempt: int | None, time: float) -> None:
        """A result of the running attempt, reported at host ``time``."""
        if self.current is not None and attempt in (None, self.current.attempt) and time > self.current.seen:
            self.current.seen = time

    def first_start(self) -> float | None:
        """The earliest start (host clock) of the runs it knows: the current one and the
        latest ended ones (KEPT_ENDED_RUNS)."""
        runs = [*self.ended_runs, *([self.current] if self.current is not None else [])]
        return min((run.started for run in runs), default=None)

    def close(self) -> None:
        """The attempt is over as far as the operator knows (stopped, paused, lost): count
        it up to the last host time seen; a later word from the host cannot reopen it."""
        if self.current is not None:
            self._close()

    def _close(self) -> None:
        run = self.current
        run.ended = True
        self.run_s += run.seconds
        self.gpu_s += run.seconds * run.gpus
        self.cpu_s += run.seconds * run.cpus
        self.counted_through = run.attempt
        self.ended_runs = [*self.ended_runs[-(KEPT_ENDED_RUNS - 1):], run]
        self.current = None

    def totals(self, admission_wait_s: float = 0.0) -> dict[str, float]:
        live = self.current.seconds if self.current is not None else 0.0
        gpus = self.current.gpus if self.current is not None else 0.0
        cpus = self.current.cpus if self.current is not None else 0.0
        return {"gpuSeconds": round(self.gpu_s + live * gpus, 3), "cpuSeconds": round(self.cpu_s + live * cpus, 3),
                "runSeconds": round(self.run_s + live, 3), "queueSeconds": round(self.queue_s + admission_wait_s, 3)}

    def to_status(self, admission_wait_s: float = 0.0) -> dict[str, Any]:
        """``Trial.status.usage``: the totals, and what a restarted operator continues from."""
        body: dict[str, Any] = {**self.totals(admission_wait_s), "countedThrough": self.counted_through,
                                "closedRunSeconds": round(self.run_s, 6), "closedGpuSeconds": round(self.gpu_s, 6),
                                "closedCpuSeconds": round(self.cpu_s, 6), "ownQueueSeconds": round(self.queue_s, 6)}
        if self.current is not None:
            body["currentRun"] = self.current.to_status()
        if self.ended_runs:
            body["endedRuns"] = [run.to_status() for run in self.ended_runs]
        return body

    @classmethod
    def from_status(cls, body: Mapping[str, Any] | None) -> "TrialUsage":
        body = body or {}

        def number(key: str, default: float = 0.0) -> float:
            value = body.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

        usage = cls(run_s=number("closedRunSeconds"), gpu_s=number("closedGpuSeconds"),
                    cpu_s=number("closedCpuSeconds"), queue_s=number("ownQueueSeconds"),
                    counted_through=int(number("countedThrough", -1)))
        usage.current = _run(body.get("currentRun"))
        ended = body.get("endedRuns") if isinstance(body.get("endedRuns"), list) else []
        usage.ended_runs = [run for run in map(_run, ended[-KEPT_ENDED_RUNS:]) if run is not None]
        for run in usage.ended_runs:
            run.ended = True
        return usage


def _run(body: Any) -> AttemptRun | None:
    if not isinstance(body, Mapping):
        return None
    try:
        return AttemptRun(int(body["attempt"]), float(body["startedAt"]), float(body["seenAt"]),
                          float(body.get("gpus", 0.0)), float(body.get("cpus", 0.0)),
                          queued=float(body.get("queuedSeconds", 0.0)))
    except (KeyError, TypeError, ValueError):
        return None


def experiment_usage(trials: Iterable[tuple[TrialUsage, float]]) -> dict[str, float]:
    """``Experiment.status.usage``: the sum over (trial usage, its admission wait), with hours."""
    total = {"gpuSeconds": 0.0, "cpuSeconds": 0.0, "runSeconds": 0.0, "queueSeconds": 0.0}
    for usage, admission_wait_s in trials:
        for key, value in usage.totals(admission_wait_s).items():
            total[key] += value
    rounded = {key: round(value, 3) for key, value in total.items()}
    return {**rounded, "gpuHours": round(total["gpuSeconds"] / 3600, 4), "cpuHours": round(total["cpuSeconds"] / 3600, 4)}
