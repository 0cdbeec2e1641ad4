"""A workload through Ray Tune (the anchor), as a user would write it.

Random search over the same space, FIFO scheduling, one CPU per trial,
``max_concurrent_trials`` as kubetune's ``parallelism``; Ray Tune's defaults
otherwise (its result loggers included) except console output (``verbose=0``)
and, when asked, ``reuse_actors``.  Ray is started by the caller (``one.py``)."""
from __future__ import annotations

import tempfile
import time
from typing import Any

from kubetune.bench.workloads import TUNE_FUNCTIONS, Workload


def run(workload: Workload, *, reuse_actors: bool) -> dict[str, Any]:
    from ray import tune

    processed = _Processed()
    with tempfile.TemporaryDirectory(prefix="kt-bench-tune-") as storage:
        started = time.time()
        tuner = tune.Tuner(
            tune.with_resources(TUNE_FUNCTIONS[workload.function], {"cpu": 1}),
            param_space={"x": tune.uniform(0.0, 1.0), **workload.config(barrier_dir=f"{storage}/barrier")},
            tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=workload.trials,
                                        max_concurrent_trials=workload.concurrency,
                                        reuse_actors=reuse_actors),
            run_config=tune.RunConfig(name="bench", storage_path=storage, verbose=0,
                                      callbacks=[processed]),
        )
        grid = tuner.fit()
        ended = time.time()
    phases: dict[str, int] = {}
    for result in grid:
        state = "Failed" if result.error else "Succeeded"
        phases[state] = phases.get(state, 0) + 1
    offered = [[entry["offered_at"] for entry in history] for history in processed.by_trial.values()
               if history and "offered_at" in history[0]]
    return {
        "started": started, "ended": ended, "makespan_s": ended - started,
        "trials_done": len(grid), "phases": phases,
        "results": processed.count,
        "last_processed": processed.last or ended,
        "offered_at": offered,
        "reported_at": [[entry["reported_at"] for entry in history] for history in processed.by_trial.values()
                        if history and "reported_at" in history[0]],
        "lags": processed.lags,
        "reuse_actors": reuse_actors,
    }


def _callback_base():
    from ray.tune import Callback
    return Callback


class _Processed(_callback_base()):
    """Counts results as Ray Tune's driver processes them."""

    def __init__(self) -> None:
        self.count = 0
        self.last: float | None = None
        self.by_trial: dict[str, list[dict]] = {}
        self.lags: list[float] = []

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.count += 1
        self.last = time.time()
        if "offered_at" in result:
            self.lags.append(self.last - result["offered_at"])
            self.by_trial.setdefault(trial.trial_id, []).append(
                {"offered_at": result["offered_at"], "reported_at": result["reported_at"]})
