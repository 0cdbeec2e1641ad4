"""``kubetune plan FILE``: what an Experiment will cost before it runs (core/plan.py).

Prints Markdown tables, to paste into a review, or the JSON of ``status.plan`` with
``-o json``.  Seconds per iteration come from Experiments measured before (those in
``spec.warmStart``, or ``--measured NAME``, read from the results store), else from
``spec.trial.expectedIterationSeconds``; the plan says which.  ``--cluster`` names a
RayCluster manifest (or a Ray autoscaler config) whose node types say whether one trial
fits and how many run at once."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from kubetune.core.plan import FROM_SPEC, NodeType, Plan, PlanError, measured_seconds_per_iteration, plan
from kubetune.local_run import load_experiment
from kubetune.results.store import URL_ENV, default_url, open_store
from kubetune.spec import SpecError, parse_experiment
from kubetune.spec.quantities import parse_memory
from kubetune.spec.resources import Resources


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="an Experiment manifest (YAML)")
    parser.add_argument("--output", "-o", choices=["table", "json"], default="table")
    parser.add_argument("--cluster", metavar="FILE", default=None,
                        help="a RayCluster manifest or Ray autoscaler config: its node types (and maxReplicas) "
                             "say whether a trial fits and how many run at once")
    parser.add_argument("--measured", metavar="EXPERIMENT", action="append", default=[],
                        help="take seconds per iteration from this earlier Experiment's results (repeatable; "
                             "spec.warmStart.experiments are used by default)")
    parser.add_argument("--namespace", "-n", default=None,
                        help="namespace of the measured Experiments (default: the manifest's, else any)")
    parser.add_argument("--store", default="", help=f"results store URL (default: ${URL_ENV}, else {default_url()})")


def main(args: argparse.Namespace) -> int:
    body = load_experiment(args.file)
    name = body["metadata"]["name"]
    try:
        spec = parse_experiment(body.get("spec") or {})
        node_types = read_node_types(args.cluster) if args.cluster else None
        measured = args.measured or list(spec.warm_start.experiments if spec.warm_start else ())
        seconds, source = measure(args.store, measured, args.namespace or body["metadata"].get("namespace"))
        result = plan(spec, study_name=name, seconds_per_iteration=seconds, seconds_source=source,
                      node_types=node_types)
    except (SpecError, PlanError, ValueError) as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps({"experiment": name, **result.to_json()}, indent=2))
    else:
        print(render(name, result))
    return 0


def measure(url: str, experiments: list[str], namespace: str | None) -> tuple[float | None, str]:
    """Median seconds per iteration of ``experiments``' stored results; (None, "") when
    none are stored (the plan then uses the spec's figure)."""
    if not experiments:
        return None, ""
    try:
        store = open_store(url or None, create=False)
    except FileNotFoundError:
        return None, ""
    try:
        timings, used = [], []
        for row in store.experiments(namespace):
            if row.name in experiments:
                found = store.iteration_times(row.uid)
                timings += found
                used += [f"{row.namespace}/{row.name}"] if found else []
    finally:
        store.close()
    seconds = measured_seconds_per_iteration(timings)
    if seconds is None:
        return None, ""
    return seconds, f"measured: {', '.join(sorted(set(used)))} ({len(timings)} results)"


def read_node_types(path: str) -> list[NodeType]:
    """Worker node types of a RayCluster (workerGroupSpecs) or a Ray autoscaler config
    (available_node_types); the head runs no trials when it says num-cpus 0."""
    with open(path) as handle:
        documents = [d for d in yaml.safe_load_all(handle) if isinstance(d, dict)]
    types: list[NodeType] = []
    for doc in documents:
        if doc.get("kind") == "RayCluster":
            types += [_worker_group(group) for group in (doc.get("spec") or {}).get("workerGroupSpecs") or []]
        for type_name, node in (doc.get("available_node_types") or {}).items():
            if type_name != doc.get("head_node_type"):
                types.append(NodeType(type_name, Resources.from_ray(node.get("resources") or {}),
                                      int(node.get("max_workers", 0))))
    if not types:
        raise ValueError(f"--cluster {path}: no RayCluster workerGroupSpecs nor autoscaler available_node_types")
    return types


def _worker_group(group: dict[str, Any]) -> NodeType:
    """One worker group's node: Ray counts the container's limits (cpu, memory,
    nvidia.com/gpu) unless rayStartParams says num-cpus / num-gpus."""
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    resources = containers[0].get("resources") or {}
    amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    params = group.get("rayStartParams") or {}
    cpu = params.get("num-cpus", amounts.get("cpu", 0))
    gpu = params.get("num-gpus", amounts.get("nvidia.com/gpu", 0))
    memory = parse_memory(amounts["memory"]) if amounts.get("memory") else 0
    return NodeType(str(group.get("groupName", "workers")),
                    Resources(cpu=_cpu(cpu), gpu=float(gpu), memory=float(memory)), int(group.get("maxReplicas", 0)))


def _cpu(value: Any) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _hours(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:,.0f}"


def render(name: str, p: Plan) -> str:
    """Markdown tables: what a platform engineer pastes into a review."""
    source = "from spec.trial.expectedIterationSeconds" if p.seconds_source == FROM_SPEC else p.seconds_source
    lines = [f"### kubetune plan: {name}", "",
             f"{p.trials} trials, scheduler {p.scheduler}, maxIterations {p.max_iterations}, "
             f"{p.parallelism} at once; each trial {p.gpus_per_trial:g} GPU and {p.cpus_per_trial:g} CPU; "
             f"{p.seconds_per_iteration:.3g} s per iteration ({source}).", "",
             "| | expected | worst case |", "|---|---:|---:|",
             f"| iterations | {p.expected_iterations:,.0f} | {p.worst_iterations:,.0f} |",
             f"| GPU-hours | {_hours(p.expected_gpu_hours)} | {_hours(p.worst_gpu_hours)} |",
             f"| CPU-hours | {_hours(p.expected_cpu_hours)} | {_hours(p.worst_cpu_hours)} |",
             f"| peak parallel GPUs | {p.peak_gpus:g} | {p.peak_gpus:g} |",
             f"| wall-clock hours (no queueing) | {_hours(p.expected_wall_hours)} | "
             f"{_hours(p.hours(p.worst_iterations, 1.0) / max(p.parallelism, 1))} |"]
    for label, budget, expected, worst in (("gpuHours", p.budget_gpu_hours, p.expected_gpu_hours, p.worst_gpu_hours),
                                           ("cpuHours", p.budget_cpu_hours, p.expected_cpu_hours, p.worst_cpu_hours)):
        if budget is not None:
            verdict = "covers the worst case" if budget >= worst else \
                "covers the expected cost" if budget >= expected else "ends the run early (BudgetExhausted)"
            lines.append(f"| spec.budget.{label} {budget:g} | {verdict} | |")
    if len(p.rungs) > 1:
        lines += ["", "| rung (iteration) | bracket | trials reaching it (expected) | at most |", "|---:|---:|---:|---:|"]
        lines += [f"| {r.iteration} | {r.bracket} | {r.expected:.1f} | {r.most} |" for r in p.rungs]
    if p.node_fit is not None:
        lines += ["", "| node type | trials per node | trials at once |", "|---|---:|---:|"]
        lines += [f"| {f.name} | {f.per_node} | {'as many as it adds' if f.at_once is None else f.at_once} |"
                  for f in p.node_fit]
    if p.notes:
        lines += [""] + [f"- {note}" for note in p.notes]
    return "\n".join(lines)
