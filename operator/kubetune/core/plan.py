"""What an Experiment will cost before it runs: trials, rungs, peak GPUs, GPU-hours.

Pure: a spec, the seconds one iteration takes (and where that figure came from), and
optionally the node types of the cluster, in; a ``Plan`` out.  ``kubetune plan`` prints
it and a suspended Experiment carries it in ``status.plan``.

Iterations are counted by each scheduler's own rung arithmetic (``TrialScheduler.planned``:
fifo runs every trial to maxIterations; asha and hyperband follow Optuna's successive
halving, core/schedulers/rungs.py; pbt lists its perturbation points), so the plan and
the run agree: tests/unit/test_plan.py compares the two on a simulated run.  GPU-hours
are iterations x seconds per iteration x GPUs per trial; queueing costs no GPU-hours.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from kubetune.core.resources import first_fit, total_of, trial_bundles
from kubetune.core.schedulers import scheduler_class
from kubetune.core.schedulers.rungs import Rung
from kubetune.spec.model import ExperimentSpec
from kubetune.spec.resources import Resources

# where seconds per iteration came from (Plan.seconds_source)
FROM_SPEC = "spec.trial.expectedIterationSeconds"
MEASURED = "measured"            # earlier Experiments' results in the results store
ASSUMED = "assumed"              # nothing known: 1 s, and the plan says so
KEPT_RUNGS = 32                  # status.plan stays bounded whatever the spec


class PlanError(ValueError):
    """The spec lacks what a plan needs; the message names the field."""


@dataclass(frozen=True)
class NodeType:
    """One kind of node a cluster has or can add: its shape and how many at most."""
    name: str
    resources: Resources
    max_count: int | None        # None: as many as the autoscaler adds (its limit not known here)


@dataclass(frozen=True)
class NodeFit:
    name: str
    per_node: int            # trials one node holds
    at_once: int | None      # trials all nodes of this type hold (per_node x max_count); None: no known limit


@dataclass(frozen=True)
class Plan:
    scheduler: str
    trials: int
    max_iterations: int
    parallelism: int                     # trials running at once (parallelism, capped by the cluster)
    gpus_per_trial: float
    cpus_per_trial: float
    seconds_per_iteration: float
    seconds_source: str                  # FROM_SPEC, MEASURED (with what) or ASSUMED
    worst_iterations: float
    expected_iterations: float
    rungs: tuple[Rung, ...] = ()
    node_fit: tuple[NodeFit, ...] | None = None   # None: node types unknown
    budget_gpu_hours: float | None = None
    budget_cpu_hours: float | None = None
    notes: tuple[str, ...] = field(default=())

    def hours(self, iterations: float, per_trial: float) -> float:
        return iterations * self.seconds_per_iteration * per_trial / 3600.0

    @property
    def peak_gpus(self) -> float:
        return self.parallelism * self.gpus_per_trial

    @property
    def worst_gpu_hours(self) -> float:
        return self.hours(self.worst_iterations, self.gpus_per_trial)

    @property
    def expected_gpu_hours(self) -> float:
        return self.hours(self.expected_iterations, self.gpus_per_trial)

    @property
    def worst_cpu_hours(self) -> float:
        return self.hours(self.worst_iterations, self.cpus_per_trial)

    @property
    def expected_cpu_hours(self) -> float:
        return self.hours(self.expected_iterations, self.cpus_per_trial)

    @property
    def expected_wall_hours(self) -> float:
        """At full parallelism, queueing aside: a floor for spec.budget.maxDuration."""
        return self.hours(self.expected_iterations, 1.0) / max(self.parallelism, 1)

    def to_json(self) -> dict[str, Any]:
        """``status.plan`` and ``kubetune plan -o json``: bounded (rungs capped)."""
        def r(value: float) -> float:
            return round(value, 3)
        body: dict[str, Any] = {
            "scheduler": self.scheduler, "trials": self.trials, "maxIterations": self.max_iterations,
            "parallelism": self.parallelism, "gpusPerTrial": self.gpus_per_trial, "cpusPerTrial": self.cpus_per_trial,
            "peakGpus": r(self.peak_gpus), "peakCpus": r(self.parallelism * self.cpus_per_trial),
            "secondsPerIteration": r(self.seconds_per_iteration), "secondsPerIterationSource": self.seconds_source,
            "iterations": {"worst": r(self.worst_iterations), "expected": r(self.expected_iterations)},
            "gpuHours": {"worst": r(self.worst_gpu_hours), "expected": r(self.expected_gpu_hours)},
            "cpuHours": {"worst": r(self.worst_cpu_hours), "expected": r(self.expected_cpu_hours)},
            "expectedWallHours": r(self.expected_wall_hours),
            "rungs": [{"iteration": g.iteration, "bracket": g.bracket, "expectedTrials": r(g.expected),
                       "mostTrials": g.most} for g in self.rungs[:KEPT_RUNGS]],
        }
        if self.node_fit is not None:
            body["nodeTypes"] = [{"name": f.name, "trialsPerNode": f.per_node, "trialsAtOnce": f.at_once}
                                 for f in self.node_fit[:KEPT_RUNGS]]
            body["fits"] = any(f.per_node > 0 for f in self.node_fit)
        if self.budget_gpu_hours is not None:
            body["budgetGpuHours"] = self.budget_gpu_hours
        if self.budget_cpu_hours is not None:
            body["budgetCpuHours"] = self.budget_cpu_hours
        if self.notes:
            body["notes"] = [note[:300] for note in self.notes[:8]]
        return body


def measured_seconds_per_iteration(timings: Iterable[tuple[str, int | None, int, float]]) -> float | None:
    """The median seconds per iteration of results already run: ``timings`` is
    (trial, attempt, iteration, time) per result.  Only steps between two results of the
    same run count (a retry's first result includes its start-up and queueing)."""
    last: dict[tuple[str, int | None], tuple[int, float]] = {}
    steps = []
    for trial, attempt, iteration, time in sorted(timings, key=lambda t: (t[0], t[1] or 0, t[2])):
        previous = last.get((trial, attempt))
        if previous is not None and iteration > previous[0] and time >= previous[1]:
            steps.append((time - previous[1]) / (iteration - previous[0]))
        last[(trial, attempt)] = (iteration, time)
    return statistics.median(steps) if steps else None


def node_fit(spec: ExperimentSpec, node_types: list[NodeType]) -> tuple[NodeFit, ...]:
    """How many trials one node of each type holds (every bundle of a trial on that
    node, first fit), and all nodes of the type together."""
    bundles = trial_bundles(spec.trial.resources)
    fits = []
    for node in node_types:
        per_node, free = 0, [node.resources]
        while per_node < 1024:
            placement = first_fit(bundles, free)
            if placement is None:
                break
            free = [free[0] - total_of(bundles)]
            per_node += 1
        fits.append(NodeFit(node.name, per_node, None if node.max_count is None else per_node * node.max_count))
    return tuple(fits)


def plan(spec: ExperimentSpec, *, study_name: str, seconds_per_iteration: float | None = None,
         seconds_source: str = "", node_types: list[NodeType] | None = None) -> Plan:
    """The plan of ``spec`` (``study_name``: the Experiment's name, which HyperBand's
    bracket assignment hashes).  Seconds per iteration: ``seconds_per_iteration`` if
    given (with ``seconds_source`` saying where it came from), else the spec's
    ``trial.expectedIterationSeconds``, else 1 s, flagged ASSUMED."""
    sched, budget, resources = spec.scheduler, spec.budget, spec.trial.resources
    if sched.max_iterations is None:
        raise PlanError("spec.scheduler.maxIterations: a plan needs the iterations per trial; "
                        "set maxIterations (the cap every trial runs to at most)")
    notes: list[str] = []
    if seconds_per_iteration is None:
        if spec.trial.expected_iteration_seconds is not None:
            seconds_per_iteration, seconds_source = spec.trial.expected_iteration_seconds, FROM_SPEC
        else:
            seconds_per_iteration, seconds_source = 1.0, ASSUMED
            notes.append("seconds per iteration unknown: assumed 1 s; set spec.trial.expectedIterationSeconds "
                         "or list measured Experiments in spec.warmStart")
    planned = scheduler_class(spec).planned(spec, study_name)
    notes += planned.notes
    trials, top = budget.max_trials, sched.max_iterations
    parallel = max(min(budget.parallelism, trials), 0)
    fit = None
    if node_types is not None:
        fit = node_fit(spec, node_types)
        unbounded = any(f.at_once is None and f.per_node > 0 for f in fit)
        holds = parallel if unbounded else sum(f.at_once or 0 for f in fit)
        if not any(f.per_node for f in fit):
            notes.append(f"no node type holds one trial ({resources.describe()} x {resources.bundles})")
        elif holds < parallel:
            notes.append(f"the cluster holds {holds} trials at once: parallelism {parallel} is not reached")
        parallel = min(parallel, holds)
    return Plan(scheduler=sched.type, trials=trials, max_iterations=top, parallelism=parallel,
                gpus_per_trial=resources.gpu * resources.bundles, cpus_per_trial=resources.cpu * resources.bundles,
                seconds_per_iteration=seconds_per_iteration, seconds_source=seconds_source,
                worst_iterations=planned.worst_iterations, expected_iterations=planned.expected_iterations,
                rungs=planned.rungs, node_fit=fit,
                budget_gpu_hours=budget.gpu_hours, budget_cpu_hours=budget.cpu_hours,
                notes=tuple(notes))
