"""How fast does the pure core schedule? A simulated 10,000-trial experiment.

``python -m kubetune.bench.core_bench [--trials N] [--parallelism P] [--restore]``

The real ``TrialRunner`` with ASHA (Optuna's SuccessiveHalvingPruner) and a shared
``ResourceLedger`` over four 8-CPU nodes, driven by the simulated executor on a fake
clock: every trial reports one iteration per tick until ASHA stops it or it reaches
maxIterations. The sampler is random search: TPE refits its model on every completed
trial, so at 10k trials the sampler, not the scheduling core, would be measured.

Each ASHA rung decision still reads every trial that reached that rung (Optuna's
pruner compares against all of them), so the cost grows with the number of trials;
``--restore`` also times rebuilding the runner from the 10k finished Trial records.
"""
from __future__ import annotations

import argparse
import sys
import time

from kubetune.core.resources import ResourceLedger, Resources
from kubetune.core.runner import TrialRunner
from kubetune.core.simulate import Simulator
from kubetune.core.types import TrialRecord
from kubetune.spec import parse_experiment

TARGET_SECONDS = 30.0


def curve(params, iteration: int) -> float:
    return (params["x"] - 0.3) ** 2 + 0.1 * abs(params["lr"] - 1e-3) + 1.0 / iteration


def build(trials: int, parallelism: int) -> tuple[TrialRunner, ResourceLedger]:
    spec = parse_experiment({
        "objective": {"metric": "loss", "mode": "min"},
        "searchSpace": {"x": {"uniform": [0, 1]}, "lr": {"loguniform": [1e-5, 1e-1]},
                        "layers": {"randint": [1, 8]}, "act": {"choice": ["relu", "gelu", "tanh"]}},
        "search": {"algorithm": "random", "seed": 0},
        "scheduler": {"type": "asha", "maxIterations": 81, "gracePeriod": 1, "reductionFactor": 3},
        "budget": {"maxTrials": trials, "parallelism": parallelism},
        "trial": {"entrypoint": "bench.core:train", "resources": {"cpu": 1}},
    })
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=32), [Resources(cpu=8)] * 4)
    return TrialRunner(spec, experiment="bench", start_time=0.0, ledger=ledger), ledger


class CountingSimulator(Simulator):
    decisions = 0

    def apply(self, decisions):
        CountingSimulator.decisions += len(decisions)
        super().apply(decisions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--parallelism", type=int, default=32)
    parser.add_argument("--restore", action="store_true", help="also time a rebuild from the finished records")
    args = parser.parse_args(argv)

    runner, ledger = build(args.trials, args.parallelism)
    sim = CountingSimulator(runner, curve, keep_log=False)
    started = time.perf_counter()
    sim.run(max_ticks=10_000_000)
    elapsed = time.perf_counter() - started
    events = sim.iterations_run + 2 * args.trials      # results + a launch and an end per trial
    summary = runner.summary(sim.now)
    print(f"{args.trials} trials (random search + ASHA, parallelism {args.parallelism}, 32 CPUs on 4 nodes)")
    print(f"  finished: {runner.finished.phase} ({runner.finished.reason}); {summary.counts}")
    print(f"  results processed: {sim.iterations_run} ({sim.iterations_run / args.trials:.2f} per trial)")
    print(f"  decisions: {CountingSimulator.decisions}, events: {events}")
    print(f"  total: {elapsed:.2f} s, {CountingSimulator.decisions / elapsed:,.0f} decisions/s, "
          f"{events / elapsed:,.0f} events/s (target < {TARGET_SECONDS:.0f} s)")
    assert ledger.used() == Resources(), "resources leaked"
    if args.restore:
        records = [TrialRecord(name=t.name, index=t.index, params=t.params, phase=t.phase,
                               history=tuple(t.history), reason=t.reason, message=t.message)
                   for t in runner.trials.values()]
        fresh, _ = build(args.trials, args.parallelism)
        started = time.perf_counter()
        fresh.restore(records)
        print(f"  restore from {len(records)} records: {time.perf_counter() - started:.2f} s")
    return 0 if elapsed < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
