"""Simulated time with workers: every method runs on the same clock, the same workers and
the same costs, so their curves differ only by their decisions.

Each running trial reports its next iteration ``cost(params, iteration)`` simulated
seconds after the previous one; the earliest report is delivered first. kubetune runs its
real ``TrialRunner`` (search, scheduler, budgets) on ``TimedSimulator``, the discrete-event
form of ``core.simulate.Simulator``; the peers (Optuna, Syne Tune, random search) run
through ``run_ask_tell``, the same event loop around an ask/tell interface.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from kubetune.bench.quality.problems import Problem
from kubetune.core.runner import TrialRunner
from kubetune.core.simulate import SimTrial, Simulator
from kubetune.spec import parse_experiment

WORKERS = 8
MAX_TRIALS = 2000       # kubetune's budget.maxTrials: the simulated budget ends a run first


@dataclass
class Trace:
    """Every result a method saw, in simulated-time order: when, the objective values
    (in the problem's metric order), whether it was the trial's last fidelity, and the
    worker-seconds spent by then (one GPU per worker: GPU-seconds)."""
    times: list[float] = field(default_factory=list)
    values: list[tuple[float, ...]] = field(default_factory=list)
    scores: list[tuple[float, ...]] = field(default_factory=list)     # the noise-free values
    final: list[bool] = field(default_factory=list)
    spent: list[float] = field(default_factory=list)
    busy: float = 0.0

    def add(self, now: float, problem: Problem, params: Mapping[str, Any], metrics: Mapping[str, float],
            iteration: int, cost: float) -> None:
        self.busy += cost
        self.times.append(now)
        self.values.append(tuple(float(metrics[m]) for m, _ in problem.metrics))
        truth = problem.truth(params, iteration) if problem.truth else metrics
        self.scores.append(tuple(float(truth[m]) for m, _ in problem.metrics))
        self.final.append(iteration >= problem.max_iterations)
        self.spent.append(self.busy)


# --- kubetune: the real runner on a discrete-event simulator -----------------------------

@dataclass
class TimedSimulator(Simulator):
    cost: Callable[[Mapping[str, Any], int], float] = lambda params, iteration: 1.0
    _due: dict[str, tuple[float, SimTrial]] = field(default_factory=dict)
    _heap: list = field(default_factory=list)
    _order: Any = field(default_factory=itertools.count)

    def apply(self, decisions: list) -> None:
        super().apply(decisions)
        for name, trial in self.running.items():      # newly launched or resumed trials
            if self._due.get(name, (None, None))[1] is not trial:
                due = self.now + self.cost(trial.params, trial.iteration + 1)
                self._due[name] = (due, trial)
                heapq.heappush(self._heap, (due, next(self._order), name))

    def run_until(self, deadline: float) -> None:
        self.apply(self.runner.step(self.now))
        while not self.runner.finished and self._heap:
            due, _, name = heapq.heappop(self._heap)
            entry = self._due.get(name)
            trial = self.running.get(name)
            if entry is None or entry[0] != due or trial is not entry[1]:
                continue                                 # stopped, paused or rescheduled since
            if due > deadline:
                break
            del self._due[name]
            self.now = due
            self.report(trial)
            self.apply(self.runner.step(self.now))


def kubetune_spec(problem: Problem, algorithm: str, scheduler: str, seed: int, workers: int) -> dict:
    return {
        **({"objective": {"metric": problem.objective, "mode": problem.metrics[0][1]}} if len(problem.metrics) == 1
           else {"objectives": [{"metric": m, "mode": mode} for m, mode in problem.metrics]}),
        "searchSpace": dict(problem.space),
        "search": {"algorithm": algorithm, "seed": seed},
        "scheduler": {"type": scheduler, "maxIterations": problem.max_iterations,
                      **({"gracePeriod": problem.grace_period, "reductionFactor": 3}
                         if scheduler in ("asha", "hyperband") else {})},
        # the trials the budget affords, where the problem says (search.algorithm auto chooses
        # by it: at 2,000 it took NSGA-II for 300 multi-objective evaluations); elsewhere the
        # simulated budget ends the run and maxTrials only has to stay out of its way
        "budget": {"maxTrials": problem.trials or MAX_TRIALS, "parallelism": workers},
        "trial": {"entrypoint": "bench.quality:train"},
    }


def experiment_name(problem: Problem, algorithm: str, scheduler: str, seed: int) -> str:
    return f"{problem.name}-{algorithm}-{scheduler}-{seed}"


def run_kubetune(problem: Problem, algorithm: str, scheduler: str, seed: int, workers: int = WORKERS) -> Trace:
    spec = parse_experiment(kubetune_spec(problem, algorithm, scheduler, seed, workers))
    runner = TrialRunner(spec, experiment=experiment_name(problem, algorithm, scheduler, seed), start_time=0.0)
    trace = Trace()
    sim: TimedSimulator

    def curve(params: Mapping[str, Any], iteration: int) -> Mapping[str, float]:
        metrics = problem.evaluate(params, iteration)
        trace.add(sim.now, problem, params, metrics, iteration, problem.cost(params, iteration))
        return metrics

    sim = TimedSimulator(runner, curve, keep_log=False, cost=problem.cost)
    sim.run_until(problem.deadline)
    return trace


# --- the peers: one event loop around ask/tell -------------------------------------------

class AskTell(Protocol):
    def ask(self) -> tuple[Any, Mapping[str, Any]] | None:
        """A new trial's handle and parameters (None: nothing more to try)."""

    def report(self, handle: Any, iteration: int, metrics: Mapping[str, float]) -> bool:
        """A result below the highest fidelity; False stops the trial."""

    def finish(self, handle: Any, metrics: Mapping[str, float], stopped: bool) -> None:
        """The trial's last result: at the highest fidelity, or where it was stopped."""


def run_ask_tell(problem: Problem, method: AskTell, workers: int = WORKERS) -> Trace:
    trace, heap, order = Trace(), [], itertools.count()

    def start(now: float) -> None:
        asked = method.ask()
        if asked is not None:
            handle, params = asked
            heapq.heappush(heap, (now + problem.cost(params, 1), next(order), handle, params, 1))

    for _ in range(workers):
        start(0.0)
    while heap:
        now, _, handle, params, iteration = heapq.heappop(heap)
        if now > problem.deadline:
            break
        metrics = problem.evaluate(params, iteration)
        trace.add(now, problem, params, metrics, iteration, problem.cost(params, iteration))
        if iteration >= problem.max_iterations:
            method.finish(handle, metrics, stopped=False)
            start(now)
        elif method.report(handle, iteration, metrics):
            heapq.heappush(heap, (now + problem.cost(params, iteration + 1), next(order), handle, params,
                                  iteration + 1))
        else:
            method.finish(handle, metrics, stopped=True)
            start(now)
    return trace
