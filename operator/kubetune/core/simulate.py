"""A simulated executor and fake clock that carry out a runner's decisions.

Each tick, every running trial reports one iteration whose objective comes from a
``curve(params, iteration)``; faults can be injected per (trial, attempt, iteration).
Pure and deterministic, so tests, the quality check and the 10k-trial benchmark drive
the real ``TrialRunner`` with no platform and no sleeps.

With ``admission_quota`` a launched trial first waits in a FIFO queue, as it waits in a
platform's queue (spec.queue): each tick the queue admits what fits in the quota (less ``foreign_usage``, another
team's share) and tells the runner, as the pod executor does, which trials wait and that
the queue is full.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kubetune.core.runner import TrialRunner
from kubetune.core.types import (
    Decision, FinishExperiment, LaunchTrial, PauseTrial, Result, StopTrial,
)

# the objective at (params, iteration), or every metric of that result (several objectives)
Curve = Callable[[Mapping[str, Any], int], "float | Mapping[str, float]"]
# (trial name, attempt, iteration about to be reported) -> None, "error", "cluster" or
# "preempted" (the queue took the trial's quota back: its run is gone, a pause)
Faults = Callable[[str, int, int], "str | None"]


@dataclass
class SimTrial:
    name: str
    params: Mapping[str, Any]
    iteration: int
    seq: int
    attempt: int
    queued_at: float = 0.0


@dataclass
class Simulator:
    runner: TrialRunner
    curve: Curve
    trial_length: int | None = None        # the function returns after this many iterations
    faults: Faults | None = None
    checkpoint_every: int = 1
    now: float = 0.0
    running: dict[str, SimTrial] = field(default_factory=dict)
    log: list[Decision] = field(default_factory=list)
    iterations_run: int = 0                # results delivered: the compute spent
    keep_log: bool = True
    admission_quota: int | None = None     # trials the queue admits at once; None: no queue
    foreign_usage: Callable[[float], int] = lambda now: 0   # of that quota, what others hold at ``now``
    waiting: dict[str, SimTrial] = field(default_factory=dict)   # launched, not admitted, in FIFO order
    # simulated seconds each trial spent running (every attempt), and the most running at once:
    # what the plan (core/plan.py) predicts, measured
    run_seconds: dict[str, float] = field(default_factory=dict)
    peak_running: int = 0
    dt: float = 1.0                        # the last tick's length

    def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if self.keep_log:
                self.log.append(decision)
            if isinstance(decision, LaunchTrial):
                trial = SimTrial(decision.name, decision.params, decision.start_iteration,
                                 decision.last_result_seq, decision.attempt, queued_at=self.now)
                (self.running if self.admission_quota is None else self.waiting)[decision.name] = trial
                # the host's clock: a trial launched in this tick reports its first iteration
                # in it too, so its run began a tick ago
                self.runner.on_trial_usage(decision.name, decision.attempt, self.now - self.dt, self.now)
                self.apply(self.runner.on_trial_launched(decision.name, self.now))
            elif isinstance(decision, (StopTrial, PauseTrial)):
                self.running.pop(decision.name, None)
                self.waiting.pop(decision.name, None)

    def admit(self) -> None:
        """The queue's turn: admit the waiting trials that fit, oldest first; the rest wait."""
        if self.admission_quota is None:
            return
        free = self.admission_quota - len(self.running) - self.foreign_usage(self.now)
        for trial in list(self.waiting.values()):
            if self.waiting.get(trial.name) is not trial:
                continue
            if free > 0:
                free -= 1
                self.running[trial.name] = self.waiting.pop(trial.name)
                self.apply(self.runner.on_admission(trial.name, False, self.now, self.now - trial.queued_at))
            else:
                self.apply(self.runner.on_admission(trial.name, True, self.now, queue_full=True))

    def reattach(self) -> None:
        """Carry on the runner's running trials, as a restarted operator re-attaches to the
        trials still running on the cluster (call after ``TrialRunner.restore``)."""
        for name in self.runner.running_trials():
            trial = self.runner.trials[name]
            self.running[name] = SimTrial(name, trial.params, trial.iteration, trial.last_seq, trial.attempt)

    def report(self, trial: SimTrial) -> None:
        """Deliver the trial's next iteration (or its error, or its completion)."""
        iteration = trial.iteration + 1
        if self.trial_length is not None and trial.iteration >= self.trial_length:
            self.running.pop(trial.name, None)
            self.apply(self.runner.on_trial_completed(trial.name, self.now))
            return
        fault = self.faults(trial.name, trial.attempt, iteration) if self.faults else None
        if fault:
            self.running.pop(trial.name, None)
            self.apply(self.runner.on_trial_errored(trial.name, f"simulated {fault} at iteration {iteration}",
                                                    self.now, cluster_fault=fault == "cluster",
                                                    evicted="Preempted" if fault == "preempted" else ""))
            return
        trial.iteration, trial.seq = iteration, trial.seq + 1
        checkpoint = f"sim://{trial.name}/{iteration}" if iteration % self.checkpoint_every == 0 else None
        value = self.curve(trial.params, iteration)
        metrics = dict(value) if isinstance(value, Mapping) else {self.runner.spec.objective.metric: value}
        result = Result(trial.seq, iteration, metrics, self.now, checkpoint, trial.attempt)
        self.iterations_run += 1
        self.apply(self.runner.on_trial_result(trial.name, result, self.now))

    def tick(self, dt: float = 1.0) -> None:
        self.dt = dt
        self.now += dt
        self.apply(self.runner.step(self.now))
        self.admit()
        self.peak_running = max(self.peak_running, len(self.running))
        for trial in list(self.running.values()):
            if self.running.get(trial.name) is trial:
                self.run_seconds[trial.name] = self.run_seconds.get(trial.name, 0.0) + dt
                self.report(trial)
        self.apply(self.runner.step(self.now))

    def run(self, max_ticks: int = 100_000) -> FinishExperiment | None:
        for _ in range(max_ticks):
            if self.runner.finished:
                break
            self.tick()
        return self.runner.finished
