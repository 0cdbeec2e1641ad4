"""Placement in the resource ledger is O(n log n) in queued trials (issue 25, N7): one
Experiment at parallelism 1,000 on a small cluster walked the whole waiting queue for
each of its queued trials, every cycle (O(n^2): ~4 M fit checks per step at 2,000), on
the event loop that also renews the Lease.  Counted in operations, not time."""
from __future__ import annotations

import math

from kubetune.core.resources import ResourceLedger, Resources


def _cycle(ledger: ResourceLedger, owners: list[str], bundles: list[Resources]) -> None:
    """What a runner's step does for each queued trial: refresh, try, ask why not."""
    for owner in owners:
        ledger.set_waiting(owner, bundles)
        if not ledger.try_acquire(owner, bundles):
            ledger.queue_reason(owner)


def _work(queued: int) -> int:
    """Fit checks plus sorts (each weighed n log n) of one steady-state cycle over ``queued``."""
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=2.0, gpu=1.0), [Resources(cpu=2.0, gpu=1.0)])
    gpu = [Resources(cpu=1.0, gpu=1.0)]
    owners = [f"ns/wide/wide-{i}" for i in range(queued)]
    _cycle(ledger, owners, gpu)           # the first trial starts, the rest queue
    counted = {"checks": 0, "sorts": 0}
    checks, queue = ledger._short_kinds, ledger._queue

    def counting_checks(bundles):
        counted["checks"] += 1
        return checks(bundles)

    def counting_queue():
        counted["sorts"] += 1
        return queue()
    ledger._short_kinds, ledger._queue = counting_checks, counting_queue
    sorts_before = getattr(ledger, "work", {}).get("sorts", 0)
    _cycle(ledger, owners[1:], gpu)       # a cycle with nothing to start: the steady state
    sorts = counted["sorts"] + getattr(ledger, "work", {}).get("sorts", 0) - sorts_before
    return sorts * queued * max(math.log2(queued), 1) + counted["checks"]


def test_a_cycle_over_n_queued_trials_costs_n_log_n_not_n_squared():
    small, large = _work(250), _work(2000)
    # n log n grows 8 * 11/8 = 11x from 250 to 2,000; n^2 would grow 64x
    assert large <= 12 * max(small, 1), (small, large)


def test_queued_trials_still_wait_in_line_and_start_in_order():
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=2.0, gpu=1.0), [Resources(cpu=2.0, gpu=1.0)])
    gpu, cpu = [Resources(cpu=0.5, gpu=1.0)], [Resources(cpu=0.5)]
    for owner in ("a", "b", "c"):
        ledger.set_waiting(owner, gpu)
    assert ledger.try_acquire("a", gpu) and not ledger.try_acquire("c", gpu)
    assert "waiting for 1 GPU" in ledger.queue_reason("c")
    assert ledger.try_acquire("d", cpu)       # backfill: asks for what nobody ahead is short of
    ledger.release("a")
    assert not ledger.try_acquire("c", gpu) and ledger.try_acquire("b", gpu)
