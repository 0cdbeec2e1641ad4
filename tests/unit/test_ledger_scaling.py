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


def _full_ledger(experiments: int, slots: int) -> tuple[ResourceLedger, list[Resources], list[str]]:
    """Every slot held, two requests of each Experiment waiting, each Experiment woken by a counter."""
    ledger, bundle = ResourceLedger(), [Resources(cpu=1.0 / slots)]
    ledger.set_capacity(Resources(cpu=1.0))
    woken: list[str] = []
    owners = [f"ns{e % 4}/e{e}/t{t}" for t in range(3) for e in range(experiments)]
    for owner in owners:
        ledger.watch(owner.rsplit("/", 1)[0] + "/", lambda o=owner: woken.append(o.rsplit("/", 1)[0]))
    for owner in owners[:slots]:
        assert ledger.try_acquire(owner, bundle)
    for owner in owners[slots:]:
        ledger.set_waiting(owner, bundle)
    return ledger, bundle, woken


def test_a_full_cluster_turns_a_trial_over_with_one_rebuild_of_the_line():
    """200 Experiments queueing on a full cluster (issue 26): a request that does not fit
    fails without the line, and a grant that leaves nothing fitting wakes nobody, so a
    trial's turnover (release, the first in line takes the slot, the others' cycles ask in
    vain) rebuilds the line once, for the release's wake."""
    ledger, bundle, woken = _full_ledger(200, slots=40)
    ledger._current_line()
    sorts = ledger.work["sorts"]
    holder = next(iter(ledger._held))
    ledger.release(holder)                       # frees a slot: the first in line is woken
    first = ledger._current_line().queue[0][0]
    assert woken[-1] == first.rsplit("/", 1)[0]
    assert ledger.try_acquire(first, bundle)
    for owner in list(ledger._waiting)[:50]:     # everybody else's cycle: nothing fits
        assert not ledger.try_acquire(owner, bundle)
    assert ledger.work["sorts"] - sorts == 1


def test_a_grant_that_leaves_room_still_wakes_the_next_in_line():
    ledger, bundle, woken = _full_ledger(10, slots=4)
    released = [owner for owner in list(ledger._held)[:2]]
    for owner in released:
        ledger.release(owner)                    # two slots free
    first = ledger._current_line().queue[0][0]
    assert ledger.try_acquire(first, bundle)     # one left: the next in line is told at once
    assert woken[-1] == ledger._current_line().queue[0][0].rsplit("/", 1)[0]
    assert ledger.try_acquire(ledger._current_line().queue[0][0], bundle)
    assert not ledger.try_acquire(ledger._current_line().queue[0][0], bundle)
