"""The human-readable status of one experiment (``TrialRunner.status_text``): counts,
resources, best trial and a table of trials truncated fairly across phases, so a
long run's few running trials are not buried under hundreds of finished ones."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kubetune.core.trial import TrialInfo
from kubetune.core.types import TrialPhase

if TYPE_CHECKING:
    from kubetune.core.runner import TrialRunner

# Phases a reader acts on come first, and win ties for rows.
DISPLAY_ORDER = (TrialPhase.RUNNING, TrialPhase.QUEUED, TrialPhase.PAUSED, TrialPhase.PENDING,
                 TrialPhase.FAILED, TrialPhase.STOPPED, TrialPhase.SUCCEEDED)


def fair_rows(by_phase: dict[TrialPhase, list[TrialInfo]], max_rows: int) -> dict[TrialPhase, int]:
    """Rows per phase: hand out one row at a time, round robin over phases that still
    have trials to show, so every phase present gets at least one row when possible."""
    shown = {phase: 0 for phase in by_phase}
    left = max_rows
    while left > 0:
        progressed = False
        for phase in DISPLAY_ORDER:
            if left > 0 and shown.get(phase, 0) < len(by_phase.get(phase, ())):
                shown[phase] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    return shown


def _value(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in params.items())


def render_status(runner: "TrialRunner", max_rows: int = 20) -> str:
    summary = runner.summary(runner.start_time)
    metric = runner.spec.objective.metric
    counts = ", ".join(f"{p.value} {summary.counts[p.value]}" for p in DISPLAY_ORDER if summary.counts[p.value])
    state = summary.finished.phase + f" ({summary.finished.reason})" if summary.finished else \
        "Suspended" if runner.spec.suspend else "Running"
    lines = [f"Experiment {runner.experiment}: {state}; {summary.created}/{summary.max_trials} trials created"
             + (f" ({counts})" if counts else "")]
    ledger = runner.ledger
    if ledger is None:
        lines.append("Resources: no cluster limits (parallelism only)")
    elif not ledger.capacity_known:
        lines.append("Resources: cluster capacity not known yet")
    else:
        lines.append(f"Resources: {ledger.used().describe()} used of {ledger.total.describe()} "
                     f"({ledger.free().describe()} free)")
    if summary.queue_reason:
        lines.append(f"Queued: {summary.queue_reason}")
    if summary.best_trial:
        lines.append(f"Best: {summary.best_trial} {metric}={_value(summary.best_metric)} at iteration "
                     f"{summary.best_iteration} ({_params(dict(summary.best_params or {}))})")
    if runner.spec_rejection:
        lines.append(f"Spec change refused: {runner.spec_rejection}")
    by_phase: dict[TrialPhase, list[TrialInfo]] = {}
    for trial in runner.trials.values():
        by_phase.setdefault(trial.phase, []).append(trial)
    shown = fair_rows(by_phase, max_rows)
    rows = [("TRIAL", "PHASE", "ITER", metric.upper(), "PARAMS / REASON")]
    hidden = []
    for phase in DISPLAY_ORDER:
        trials = by_phase.get(phase, [])
        # Terminal phases show their latest trials; live ones their oldest.
        chosen = trials[-shown.get(phase, 0):] if phase.is_terminal and shown.get(phase) else trials[:shown.get(phase, 0)]
        for trial in chosen:
            detail = f"{trial.reason}: {trial.message}" if trial.message else trial.reason
            rows.append((trial.name, phase.value, str(trial.iteration), _value(trial.last_value),
                         _params(trial.params) + (f"  [{detail}]" if detail else "")))
        if len(trials) > len(chosen):
            hidden.append(f"{len(trials) - len(chosen)} more {phase.value}")
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])) + "  " + row[4] for row in rows]
    if hidden:
        lines.append("... " + ", ".join(hidden))
    return "\n".join(lines)
