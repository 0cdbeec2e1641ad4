"""The live table ``kubetune run`` and the demo print: trials with phase,
parameters and metric, truncated fairly (running first, then the best finished)."""
from __future__ import annotations

from typing import IO, Any, Mapping

MAX_ROWS = 12


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def trial_rows(trials: Mapping[str, Mapping[str, Any]], *, mode: str, max_rows: int = MAX_ROWS) -> tuple[list[list[str]], int]:
    """Rows to show and how many were left out: every running trial first (up to the
    limit), then finished ones best-first, then the rest in creation order."""
    def metric(t):
        value = (t.get("status") or {}).get("bestMetric")
        if value is None:
            return float("inf")
        return value if mode == "min" else -value

    items = sorted(trials.values(), key=lambda t: t["spec"]["index"])
    running = [t for t in items if (t.get("status") or {}).get("phase") == "Running"]
    finished = sorted((t for t in items if (t.get("status") or {}).get("phase") in ("Succeeded", "Stopped")), key=metric)
    rest = [t for t in items if t not in running and t not in finished]
    chosen = (running + finished + rest)[:max_rows]
    rows = []
    for trial in chosen:
        status = trial.get("status") or {}
        params = ", ".join(f"{k}={format_value(v)}" for k, v in trial["spec"]["parameters"].items())
        rows.append([trial["metadata"]["name"], status.get("phase", "Pending"), str(status.get("iteration", 0)),
                     format_value(status.get("bestMetric", "")), params])
    return rows, len(items) - len(chosen)


def render(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(header)] + [line(r) for r in rows])


def live_trials(controller: Any, store: Any) -> Mapping[str, Mapping[str, Any]]:
    """Trials as the runner sees them now (the store's copy lags by the write coalescing)."""
    if controller.runner is None:
        return store.trials
    return {name: {"metadata": {"name": name}, "spec": {"index": t.index, "parameters": t.params},
                   "status": {"phase": t.phase.value, "iteration": t.iteration, "bestMetric": t.best_value}
                   if t.best_value is not None else {"phase": t.phase.value, "iteration": t.iteration}}
            for name, t in controller.runner.trials.items()}


def draw(stream: IO[str], controller: Any, store: Any, *, final: bool = False) -> None:
    status = store.experiment_status
    mode = controller.spec.objective.mode if controller.spec else "min"
    rows, hidden = trial_rows(live_trials(controller, store), mode=mode)
    if stream.isatty() and not final:
        stream.write("\x1b[2J\x1b[H")   # redraw in place on a terminal; a log gets every frame
    stream.write(f"\n{controller.name}: {status.get('phase', 'Pending')}  {status.get('progress', '')}  "
                 f"{status.get('message', '')}\n")
    if status.get("queueReason"):
        stream.write(f"queued: {status['queueReason']}\n")
    stream.write(render(rows, ["TRIAL", "PHASE", "ITER", "METRIC", "PARAMETERS"]) + "\n")
    if hidden:
        stream.write(f"... and {hidden} more trials\n")
    front = status.get("paretoFront")
    if final and front:
        stream.write(f"Pareto front: {front['size']} trials\n")
        for point in front["points"]:
            values = "  ".join(f"{k}={format_value(v)}" for k, v in point["values"].items())
            stream.write(f"  {point['trial']}  {values}  parameters={point['parameters']}\n")
    best = status.get("bestTrial")
    if final and best:
        stream.write(f"best trial: {best['name']}  {controller.spec.objective.metric}={format_value(best['metric'])}  "
                     f"parameters={best['parameters']}\n")
    stream.flush()
