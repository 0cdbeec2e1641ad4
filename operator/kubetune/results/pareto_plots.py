"""PNG plots for several objectives, from the stored results (``kubetune results EXP
--plot DIR --objectives loss:min:2.0,model_size:min:1.0 --constraints memory_gb:max:2``):

- ``pareto.png``: every succeeded trial's final values of the first two objectives, the
  feasible non-dominated ones (Optuna's non-dominated sorting) in red, joined as a
  staircase; infeasible trials as crosses, never on the front;
- ``hypervolume.png``: the front's hypervolume up to the reference point after k
  feasible succeeded trials (creation order), when every objective names its reference.

The store keeps results, not the Experiment's spec, so the objectives and constraints
are given on the command line; with the Experiment's own, the front and the hypervolume
are those of its ``status.paretoFront`` and ``status.hypervolume``."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kubetune.core.optuna_compat import is_pareto_front

from kubetune.core.pareto import hypervolume_history
from kubetune.results.export import Report
from kubetune.results.plots import _save, _title
from kubetune.spec.model import Constraint


def parse_objectives(text: str) -> list[tuple[str, str, float | None]]:
    """``metric:min|max[:reference],...`` -> [(metric, mode, reference)]."""
    objectives = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) not in (2, 3) or parts[1] not in ("min", "max") or not parts[0]:
            raise SystemExit(f"--objectives: expected metric:min|max[:reference], e.g. loss:min:2.0 (got {item!r})")
        try:
            reference = float(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise SystemExit(f"--objectives: the reference of {parts[0]} is not a number: {parts[2]!r}") from None
        objectives.append((parts[0], parts[1], reference))
    if len(objectives) < 2:
        raise SystemExit("--objectives: name at least two objectives")
    return objectives


def parse_constraints(text: str) -> list[Constraint]:
    """``metric:max|min:value,...`` -> the spec's constraints (a metric may appear twice)."""
    bounds: dict[str, dict[str, float]] = {}
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or parts[1] not in ("max", "min") or not parts[0]:
            raise SystemExit(f"--constraints: expected metric:max|min:value, e.g. memory_gb:max:2 (got {item!r})")
        try:
            bounds.setdefault(parts[0], {})[parts[1]] = float(parts[2])
        except ValueError:
            raise SystemExit(f"--constraints: the bound of {parts[0]} is not a number: {parts[2]!r}") from None
    return [Constraint(metric=name, **bound) for name, bound in bounds.items()]


def _latest(report: Report, metrics: list[str]) -> dict[str, dict[str, float]]:
    """Trial UID -> the last finite value it reported of each metric."""
    latest: dict[str, dict[str, float]] = {}
    for result in sorted(report.results, key=lambda r: (r.trial_uid, r.seq)):
        for metric in metrics:
            value = result.metrics.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                latest.setdefault(result.trial_uid, {})[metric] = float(value)
    return latest


def infeasible(report: Report, constraints: list[Constraint]) -> set[str]:
    """Names of the trials whose last value of a constraint metric breaks it (one never
    reported, or not finite, breaks it: the operator's rule, ``Constraint.violation``)."""
    latest = _latest(report, [c.metric for c in constraints])
    return {t.name for t in report.trials
            if any(c.violation(latest.get(t.uid, {}).get(c.metric)) > 0 for c in constraints)}


def final_values(report: Report, metrics: list[str]) -> dict[str, list[float]]:
    """Succeeded trial -> the last finite value it reported of each metric (trials that
    lack one are left out), in creation order."""
    latest = _latest(report, metrics)
    finals = {}
    for trial in sorted(report.trials, key=lambda t: t.index):
        values = latest.get(trial.uid, {})
        if trial.phase == "Succeeded" and len(values) == len(metrics):
            finals[trial.name] = [values[m] for m in metrics]
    return finals


def pareto_front(report: Report, objectives: list[tuple[str, str, float | None]],
                 constraints: list[Constraint] = ()) -> dict[str, list[float]]:
    """The feasible non-dominated succeeded trials -> their objective values."""
    signs = [1.0 if mode == "min" else -1.0 for _, mode, _ in objectives]
    broken = infeasible(report, list(constraints))
    finals = {n: v for n, v in final_values(report, [m for m, _, _ in objectives]).items() if n not in broken}
    losses = [[s * v for s, v in zip(signs, values)] for values in finals.values()]
    on_front = is_pareto_front(np.asarray(losses), assume_unique_lexsorted=False) if losses else []
    return {name: values for (name, values), keep in zip(finals.items(), on_front) if keep}


def draw_pareto(report: Report, directory: str | Path, objectives: list[tuple[str, str, float | None]],
                constraints: list[Constraint] = ()) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    metrics = [m for m, _, _ in objectives]
    signs = [1.0 if mode == "min" else -1.0 for _, mode, _ in objectives]
    broken = infeasible(report, list(constraints))
    every = final_values(report, metrics)
    finals = {n: v for n, v in every.items() if n not in broken}
    losses = [[s * v for s, v in zip(signs, values)] for values in finals.values()]
    front = sorted(pareto_front(report, objectives, constraints).values())

    figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
    if finals:
        xs, ys = zip(*[(v[0], v[1]) for v in finals.values()])
        axes.scatter(xs, ys, color="tab:grey", alpha=0.6, label="succeeded trial")
    if len(every) > len(finals):
        xs, ys = zip(*[(v[0], v[1]) for n, v in every.items() if n in broken])
        axes.scatter(xs, ys, color="tab:grey", marker="x", alpha=0.6, label=f"infeasible ({len(xs)})")
    if front:
        axes.step([v[0] for v in front], [v[1] for v in front], where="post" if signs[1] > 0 else "pre",
                  color="tab:red", linewidth=1)
        axes.scatter([v[0] for v in front], [v[1] for v in front], color="tab:red", zorder=3,
                     label=f"Pareto front ({len(front)})")
        axes.legend()
    axes.set_xlabel(f"{metrics[0]} ({objectives[0][1]})")
    axes.set_ylabel(f"{metrics[1]} ({objectives[1][1]})")
    extra = f", first 2 of {len(metrics)} objectives" if len(metrics) > 2 else ""
    axes.set_title(_title(report, f"Pareto front{extra}"))
    paths = [_save(figure, directory / "pareto.png")]

    references = [r for _, _, r in objectives]
    if all(r is not None for r in references):
        history = hypervolume_history(losses, [s * r for s, r in zip(signs, references)])
        figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
        if history:
            axes.plot([k for k, _ in history], [v for _, v in history], marker="o", color="tab:blue")
        axes.set_xlabel("feasible succeeded trials (creation order)" if constraints
                        else "succeeded trials (creation order)")
        axes.set_ylabel("hypervolume")
        axes.set_title(_title(report, "hypervolume of the Pareto front"))
        paths.append(_save(figure, directory / "hypervolume.png"))
    return paths
