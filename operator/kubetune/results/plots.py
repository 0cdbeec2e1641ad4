"""PNG plots of one Experiment's stored results, drawn with matplotlib (headless):

- ``history.png``: optimisation history, each trial's best objective in the order the
  trials were created, and the best so far;
- ``curves.png``: learning curves, the objective over iterations, one line per trial;
- ``parallel.png``: parallel coordinates, one line per trial through its parameters
  and its best objective, coloured by that objective.

Non-finite objective values (a diverged trial) have no place on a numeric axis: they
are left out of the lines and counted in the titles."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kubetune.results.export import Report

MAX_LEGEND_TRIALS = 12


def draw(report: Report, directory: str | Path) -> list[Path]:
    try:
        import matplotlib
    except ImportError as error:   # an extra: the operator image does not need it
        raise SystemExit("kubetune results --plot needs matplotlib: pip install 'kubetune[plots]'") from error
    matplotlib.use("Agg")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    curves = _curves(report)
    best = {name: _best(values, report.experiment.mode) for name, values in curves.items()}
    paths = [_history(report, best, directory / "history.png"),
             _learning_curves(report, curves, directory / "curves.png"),
             _parallel(report, best, directory / "parallel.png")]
    return paths


def _curves(report: Report) -> dict[str, list[tuple[int, float]]]:
    """Trial name -> [(iteration, objective)], trials in creation order."""
    metric = report.experiment.metric
    curves: dict[str, list[tuple[int, float]]] = {t.name: [] for t in report.trials}
    for result in report.results:
        value = result.metrics.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            curves.setdefault(report.trial_names.get(result.trial_uid, result.trial_uid), []).append(
                (result.iteration, float(value)))
    return curves


def _best(values: list[tuple[int, float]], mode: str) -> float | None:
    finite = [v for _, v in values if math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if mode == "max" else min(finite)


def _title(report: Report, what: str, diverged: int = 0) -> str:
    e = report.experiment
    extra = f" ({diverged} trial(s) without a finite value left out)" if diverged else ""
    return f"{e.namespace}/{e.name}: {what}{extra}"


def _history(report: Report, best: dict[str, float | None], path: Path) -> Path:
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
    points = [(i, v) for i, v in enumerate(best.values()) if v is not None]
    if points:
        xs, ys = zip(*points)
        axes.scatter(xs, ys, label="trial's best", color="tab:blue")
        running, so_far = [], None
        for y in ys:
            so_far = y if so_far is None else (max if report.experiment.mode == "max" else min)(so_far, y)
            running.append(so_far)
        axes.step(xs, running, where="post", color="tab:red", label="best so far")
        axes.legend()
    axes.set_xlabel("trial (creation order)")
    axes.set_ylabel(f"{report.experiment.metric} ({report.experiment.mode})")
    axes.set_title(_title(report, "optimisation history", len(best) - len(points)))
    return _save(figure, path)


def _learning_curves(report: Report, curves: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
    diverged = 0
    for name, values in curves.items():
        if not values:
            continue
        if not any(math.isfinite(v) for _, v in values):
            diverged += 1
        # a non-finite value breaks the line (NaN gap) rather than stretching the axis
        axes.plot([i for i, _ in values], [v if math.isfinite(v) else math.nan for _, v in values],
                  label=name, linewidth=1)
    if 0 < len(curves) <= MAX_LEGEND_TRIALS:
        axes.legend(fontsize="small")
    axes.set_xlabel("iteration")
    axes.set_ylabel(report.experiment.metric)
    axes.set_title(_title(report, "learning curves", diverged))
    return _save(figure, path)


def _parallel(report: Report, best: dict[str, float | None], path: Path) -> Path:
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors
    trials = [t for t in report.trials if best.get(t.name) is not None]
    names = list(dict.fromkeys(p for t in trials for p in t.params))
    axes_values = [[_position(t.params.get(p)) for t in trials] for p in names]
    axes_values.append([best[t.name] for t in trials])
    labels = [*names, report.experiment.metric]
    figure, axes = plt.subplots(figsize=(max(6, 2 * len(labels)), 5), dpi=100)
    scaled, ticks = [], []
    for column in axes_values:
        column, tick = _scale(column)
        scaled.append(column)
        ticks.append(tick)
    objective = axes_values[-1]
    norm = colors.Normalize(min(objective, default=0), max(objective, default=1))
    # the best trials stand out in the brightest colour, whichever the mode
    cmap = matplotlib.colormaps["viridis_r" if report.experiment.mode != "max" else "viridis"]
    for j in range(len(trials)):
        axes.plot(range(len(labels)), [column[j] for column in scaled], color=cmap(norm(objective[j])),
                  alpha=0.8, linewidth=1.2)
    for x, (low, high) in enumerate(ticks):
        axes.axvline(x, color="grey", linewidth=0.8)
        axes.text(x, -0.04, low, ha="center", va="top", fontsize="small")
        axes.text(x, 1.04, high, ha="center", va="bottom", fontsize="small")
    axes.set_xticks(range(len(labels)), labels)
    axes.set_yticks([])
    axes.set_ylim(-0.12, 1.12)
    axes.set_title(_title(report, "parallel coordinates", len(report.trials) - len(trials)), pad=18)
    figure.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label=report.experiment.metric)
    return _save(figure, path)


def _position(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _scale(column: list[Any]) -> tuple[list[float], tuple[str, str]]:
    """A column onto [0, 1]: numbers linearly (log for positive values over 2 decades),
    categories evenly in sorted order.  Returns the labels of both ends."""
    if column and all(isinstance(v, (int, float)) for v in column):
        values = [float(v) for v in column]
        use_log = min(values) > 0 and max(values) / min(values) > 100
        mapped = [math.log10(v) for v in values] if use_log else values
        low, high = min(mapped), max(mapped)
        span = high - low or 1.0
        return [(v - low) / span for v in mapped], (f"{min(values):.3g}", f"{max(values):.3g}")
    categories = sorted({str(v) for v in column})
    step = 1.0 / max(1, len(categories) - 1)
    index = {c: i * step for i, c in enumerate(categories)}
    return [index[str(v)] for v in column], (categories[0] if categories else "", categories[-1] if categories else "")


def _save(figure, path: Path) -> Path:
    import matplotlib.pyplot as plt
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return path
