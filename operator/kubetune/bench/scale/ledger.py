"""``python -m kubetune.bench.scale.ledger``: what the shared cluster's ledger costs the
operator at the scale bench's shape, in process, without a cluster (issue 26).

The ledger (core/resources.py) rebuilds its fair line (core/fair_share.py) after every
grant and release, over every waiting request of every Experiment on the cluster.  The
scale bench's ``many`` + ``big`` shapes leave about 430 requests waiting on 40 slots
(200 Experiments at parallelism 2, one at 32); a py-spy profile of that run found a third
of the operator's event loop in this rebuild.  This times, as the median of ``--repeat``:

- one rebuild of the line;
- one trial's turnover: a release and the next grant, as a runner does them (each Experiment
  has a waker, so a release looks for the first in line at once).

Prints one JSON object with the figures, the sizes, the load average and the commit."""
from __future__ import annotations

import argparse
import json
import statistics
import time

from kubetune.bench import machine
from kubetune.core.resources import ResourceLedger
from kubetune.spec.resources import Resources


def build(experiments: int, namespaces: int, parallelism: int, big: int, slots: int) -> ResourceLedger:
    """A ledger of ``slots`` one-bundle slots, all held, and the requests that wait for them."""
    ledger = ResourceLedger()
    bundle = [Resources(cpu=1.0 / slots)]
    ledger.set_capacity(Resources(cpu=1.0))
    owners = [f"ns{e % namespaces}/e{e}/t{t}" for t in range(parallelism) for e in range(experiments)]
    owners += [f"big/e/t{t}" for t in range(big)]
    for owner in owners:
        ledger.watch(owner.rsplit("/", 1)[0] + "/", lambda: None)
    for owner in owners[:slots]:
        assert ledger.try_acquire(owner, bundle), owner
    for owner in owners[slots:]:
        ledger.set_waiting(owner, bundle)
    return ledger


def _median_s(action, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.scale.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", type=int, default=200)
    parser.add_argument("--namespaces", type=int, default=20)
    parser.add_argument("--parallelism", type=int, default=2, help="trials each Experiment asks for at once")
    parser.add_argument("--big", type=int, default=32, help="parallelism of the one big Experiment")
    parser.add_argument("--slots", type=int, default=40, help="trials the cluster holds at once")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args(argv)
    start_load = machine.loadavg_text()
    ledger = build(args.experiments, args.namespaces, args.parallelism, args.big, args.slots)
    bundle = [Resources(cpu=1.0 / args.slots)]
    waiting = len(ledger.waiting_bundles())

    def rebuild() -> None:
        ledger._line = None          # what every grant and release does
        ledger.waiting_bundles()

    def turnover() -> None:
        # a holder finishes; the first in line (woken) takes its slot and the finished trial's
        # Experiment queues its next one at the end of the line
        holder = next(iter(ledger._held))
        ledger.release(holder)
        first = ledger._current_line().queue[0][0]
        assert ledger.try_acquire(first, bundle), first
        ledger.set_waiting(holder, bundle)

    out = {"waiting": waiting, "slots": args.slots, "experiments": args.experiments + 1,
           "rebuild_ms": round(_median_s(rebuild, args.repeat) * 1e3, 3),
           "turnover_ms": round(_median_s(turnover, args.repeat) * 1e3, 3),
           "load_start": start_load, "load_end": machine.loadavg_text(),
           "commit": machine.git_state()[0]}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
