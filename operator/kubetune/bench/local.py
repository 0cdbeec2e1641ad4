"""A workload through kubetune: ``local_run.run_experiment``, the very controller loop
the operator runs (runner, Ray executor with pooled workers, status coalescing), with
the in-memory store instead of the API server.

Ray is started by the caller (``one.py``) with the workload's logical CPUs."""
from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from typing import Any

from kubetune.bench.workloads import Workload


def run(workload: Workload) -> dict[str, Any]:
    from kubetune.local_run import run_experiment

    processed = _ProcessedClock(workload.results)
    with tempfile.TemporaryDirectory(prefix="kt-bench-") as storage:
        body = {"apiVersion": "kubetune.dev/v1alpha1", "kind": "Experiment",
                "metadata": {"name": "bench", "namespace": "bench", "generation": 1, "uid": str(uuid.uuid4())},
                "spec": workload.kubetune_spec(barrier_dir=f"{storage}/barrier")}
        started = time.time()
        controller, store = asyncio.run(run_experiment(
            body, ray_address="local", checkpoint_storage=storage, show=False, on_cycle=processed))
        ended = time.time()
    trials = controller.runner.trials.values()
    histories = [list(t.history) for t in trials]
    phases: dict[str, int] = {}
    for trial in trials:
        phases[trial.phase.value] = phases.get(trial.phase.value, 0) + 1
    return {
        "started": started, "ended": ended, "makespan_s": ended - started,
        "trials_done": sum(1 for t in trials if t.phase.is_terminal),
        "phases": phases,
        "results": sum(t.last_seq + 1 for t in trials),   # the history is a downsampled curve
        "last_processed": processed.at or ended,
        "offered_at": [[entry["offered_at"] for entry in h] for h in histories if h and "offered_at" in h[0]],
        "reported_at": [[entry["reported_at"] for entry in h] for h in histories if h and "reported_at" in h[0]],
        "lags": processed.lags,
        "store_writes": store.writes,
        "experiment_phase": store.experiment_status.get("phase"),
    }


class _ProcessedClock:
    """After each controller cycle: which results the runner holds now (their lag behind
    ``offered_at``), and when it held every result."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.at: float | None = None
        self.lags: list[float] = []
        self._seen: dict[str, int] = {}
        self._running: set[str] = set()
        self._total = 0

    def __call__(self, controller) -> None:
        runner = controller.runner
        if self.at is not None or runner is None:
            return
        now = time.time()
        running = set(runner.running_trials())
        # only trials running now or at the last cycle can hold new results: the
        # benchmark's own bookkeeping stays small next to the controller's
        for name in running | self._running:
            history = runner.trials[name].history
            seen = self._seen.get(name, 0)
            if len(history) > seen:
                self.lags.extend(now - entry["offered_at"] for entry in history[seen:] if "offered_at" in entry)
                self._seen[name] = len(history)
                self._total += len(history) - seen
        self._running = running
        if self._total >= self.expected:
            self.at = now
