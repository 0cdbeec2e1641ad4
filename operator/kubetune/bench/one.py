"""One measured run in a fresh process: one tuner, one workload, one Ray instance.

``python -m kubetune.bench.one SIDE WORKLOAD --out FILE [--quick] [--trials N]``

SIDE is ``kubetune``, ``raytune`` (Ray Tune defaults: a new actor per trial) or
``raytune-reuse`` (``reuse_actors=True``) or ``ray-floor`` (bare Ray actors, one per
slot: the ceiling, see ``floor.py``); WORKLOAD a key of ``workloads.workloads()``
or ``core``.  Ray is started here with the workload's logical CPUs (the same for
every side), in a temporary directory of its own, and shut down at the end; the
timed part starts after ``ray.init`` returned.  The figures go to FILE as JSON.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time

SIDES = ("kubetune", "raytune", "raytune-reuse", "ray-floor")


def run_core(trials: int, parallelism: int = 32) -> dict:
    """Workload 5: the pure runner on the simulated executor (``core_bench``)."""
    from kubetune.bench import core_bench
    from kubetune.core.resources import Resources

    core_bench.CountingSimulator.decisions = 0
    runner, ledger = core_bench.build(trials, parallelism)
    sim = core_bench.CountingSimulator(runner, core_bench.curve, keep_log=False)
    started = time.perf_counter()
    sim.run(max_ticks=10_000_000)
    elapsed = time.perf_counter() - started
    assert ledger.used() == Resources(), "resources leaked"
    return {"trials": trials, "parallelism": parallelism, "seconds": elapsed,
            "decisions": core_bench.CountingSimulator.decisions, "results": sim.iterations_run,
            "events": sim.iterations_run + 2 * trials, "finished": runner.finished.reason}


def run_side(side: str, workload) -> dict:
    import ray

    temp_dir = tempfile.mkdtemp(prefix="ktb-", dir="/tmp")   # short: Ray's socket paths
    try:
        started = time.time()
        ray.init(num_cpus=workload.cpus, num_gpus=0, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, namespace="kubetune", _temp_dir=temp_dir)
        ray_start_s = time.time() - started
        if side == "kubetune":
            from kubetune.bench import local
            figures = local.run(workload)
        elif side == "ray-floor":
            from kubetune.bench import floor
            figures = floor.run(workload)
        else:
            from kubetune.bench import raytune
            figures = raytune.run(workload, reuse_actors=side == "raytune-reuse")
        figures["ray_start_s"] = ray_start_s
        return figures
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("side", choices=SIDES + ("core",))
    parser.add_argument("workload")
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--trials", type=int, default=0, help="override the workload's trial count")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if args.side == "core":
        figures = run_core(args.trials or (2_000 if args.quick else 10_000))
    else:
        from kubetune.bench.workloads import workloads
        workload = workloads(args.quick)[args.workload]
        if args.trials:
            workload = workload.with_trials(args.trials)
        figures = run_side(args.side, workload)
    with open(args.out, "w") as handle:
        json.dump(figures, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
