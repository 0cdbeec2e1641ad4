"""An Experiment's time budgets: ``spec.budget.maxDuration`` and the GPU- and CPU-hour
budgets (``gpuHours`` / ``cpuHours``): when is one used up, and which running trial stops.
The runner asks these at its few decision points (runner.py: step, _check_finished;
runner_events.py: on_trial_result; runner_restart.py: _reopen_if_allowed).

The budget counts what the trials really used (core/usage.py: the hosts' own start
and end times), not what a plan expected, so under ASHA and HyperBand a run whose
trials stop early gets more trials for the same hours.  It is used up when the hours
used plus the smallest step anything new takes (one trial's first rung: gracePeriod
iterations at the seconds per iteration measured so far) would exceed it.  Then
nothing new starts (no trial, retry or exploit); a running trial stops at its next
report (``onExhausted: stop``) or at its next rung, where a promotion would start
(``finishRung``); the Experiment ends Succeeded, reason BudgetExhausted, with its
best trial.  Raising the budget (a spec edit) reopens it.  Pure.
"""
from __future__ import annotations

from typing import Iterable

from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec

BUDGET_EXHAUSTED = "BudgetExhausted"
MAX_DURATION_REACHED = "MaxDurationReached"


def duration(seconds: float) -> str:
    """``seconds`` as people write it: 1h2m5s, 40s, 0s."""
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"


def reached(spec: ExperimentSpec, trials: Iterable[TrialInfo], *, now: float | None, start_time: float,
            created: int, running: int) -> tuple[str, str] | None:
    """The budget that ends the Experiment now, as (reason, what happened), or None:
    maxDuration (at once), else used-up hours once no trial runs any more (a running one
    stops at its next report or rung: ``stops_now``)."""
    max_s = spec.budget.max_duration_s
    if max_s is not None and now is not None and now - start_time >= max_s:
        return MAX_DURATION_REACHED, f"maxDuration {duration(max_s)} reached after {created} trials"
    spent = exhausted(spec, trials)
    if spent and not running:
        return BUDGET_EXHAUSTED, spent
    return None


def limited(spec: ExperimentSpec) -> bool:
    return spec.budget.gpu_hours is not None or spec.budget.cpu_hours is not None


def used_hours(trials: Iterable[TrialInfo]) -> tuple[float, float, float, int]:
    """(GPU-hours, CPU-hours, run seconds, iterations reached) over every trial."""
    gpu = cpu = run = 0.0
    iterations = 0
    for trial in trials:
        totals = trial.usage.totals()
        gpu, cpu, run = gpu + totals["gpuSeconds"], cpu + totals["cpuSeconds"], run + totals["runSeconds"]
        iterations += trial.iteration
    return gpu / 3600, cpu / 3600, run, iterations


def exhausted(spec: ExperimentSpec, trials: Iterable[TrialInfo]) -> str:
    """Why the budget is used up, or would be by one more first rung ("" while not)."""
    if not limited(spec):
        return ""
    budget, resources = spec.budget, spec.trial.resources
    gpu_h, cpu_h, run_s, iterations = used_hours(trials)
    next_gpu_h = next_cpu_h = 0.0
    if iterations:
        first_rung_h = spec.scheduler.grace_period * run_s / iterations / 3600
        next_gpu_h = first_rung_h * resources.gpu * resources.bundles
        next_cpu_h = first_rung_h * resources.cpu * resources.bundles
    for name, used, more, limit in (("gpuHours", gpu_h, next_gpu_h, budget.gpu_hours),
                                    ("cpuHours", cpu_h, next_cpu_h, budget.cpu_hours)):
        if limit is not None and (used >= limit or used + more > limit):
            return (f"spec.budget.{name} {limit:g} used up: {used:.4g} used"
                    + (f", and a first rung ({more:.3g}) more would pass it" if used < limit else ""))
    return ""


def stops_now(spec: ExperimentSpec, at_rung: bool, iteration: int) -> bool:
    """Whether a running trial that just reported ``iteration`` stops, the budget being
    used up: at once (stop), or where its next promotion would start (finishRung)."""
    if spec.budget.on_exhausted == "stop":
        return True
    top = spec.scheduler.max_iterations
    return at_rung or (top is not None and iteration >= top)
