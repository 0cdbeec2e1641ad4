"""Freed room goes to every request that fits at once, in fair order (issue 26,
core/handover.py): the ledger used to wake only the first fitting request's Experiment
and refuse everyone else until that one had taken its slot, one cycle per slot."""
from __future__ import annotations

from kubetune.core.resources import ResourceLedger, Resources

CPU = [Resources(cpu=1.0)]


def _full(slots: int, waiting: list[str]) -> tuple[ResourceLedger, list[str], list[str]]:
    """A cluster of ``slots`` CPUs held by ``ns/holder/t<i>``, ``waiting`` queued in that
    order, every Experiment watched: (ledger, holders, the Experiments woken so far)."""
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=slots), [Resources(cpu=slots)])
    woken: list[str] = []
    for owner in waiting:
        experiment = owner.rsplit("/", 1)[0] + "/"
        ledger.watch(experiment, lambda e=experiment: woken.append(e))
    holders = [f"hold/holder/t{i}" for i in range(slots)]
    for owner in holders:
        assert ledger.try_acquire(owner, CPU)
    for owner in waiting:
        ledger.set_waiting(owner, CPU)
        assert not ledger.try_acquire(owner, CPU)
    return ledger, holders, woken


def test_slots_freed_together_wake_as_many_experiments_as_fit():
    waiting = [f"ns{i}/e{i}/t0" for i in range(5)]
    ledger, holders, woken = _full(4, waiting)
    for owner in holders[:3]:
        ledger.release(owner)
    assert woken == ["ns0/e0/", "ns1/e1/", "ns2/e2/"]        # the first three in line, each once


def test_each_of_them_may_start_in_any_order_but_not_the_one_behind():
    waiting = [f"ns{i}/e{i}/t0" for i in range(5)]
    ledger, holders, _ = _full(4, waiting)
    for owner in holders[:3]:
        ledger.release(owner)
    assert not ledger.try_acquire(waiting[3], CPU)       # fourth: the room is the first three's
    assert ledger.try_acquire(waiting[2], CPU)           # third first: its Experiment cycled sooner
    assert ledger.try_acquire(waiting[0], CPU)
    assert not ledger.try_acquire(waiting[3], CPU)
    assert ledger.try_acquire(waiting[1], CPU)
    assert ledger.free() == Resources()


def test_a_turn_is_kept_when_one_behind_takes_its_slot_first():
    """ns2's two requests were both given a turn; its later one took its slot first. The
    rebuilt line then ties ns2's earlier request with ns1's (equal shares) and the tie
    goes to ns1's earlier arrival: the room told to ns2 must still be ns2's."""
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=5), [Resources(cpu=5)])
    owners = ["ns1/a/t0", "ns2/b/t1", "ns2/b/t2", "ns1/c/t3", "ns1/c/t4", "ns2/a/t5"]
    for owner in owners:
        ledger.set_waiting(owner, CPU)
    for owner in ("ns2/b/t1", "ns1/a/t0", "ns1/c/t3", "ns2/b/t2"):
        assert ledger.try_acquire(owner, CPU)
    assert not ledger.try_acquire("ns1/c/t4", CPU)
    assert ledger.try_acquire("ns2/a/t5", CPU)           # ns2: 3 of 5, ns1 2 of 5 and one waiting


def test_a_later_request_does_not_take_room_an_earlier_one_is_short_of():
    """Two CPUs free: the first in line asks for three and waits; one behind it asking for
    one does not take them (it would starve the first), one asking for a GPU may."""
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=4, gpu=1), [Resources(cpu=4, gpu=1)])
    assert ledger.try_acquire("ns/x/t0", [Resources(cpu=2)])
    ledger.set_waiting("ns/big/t0", [Resources(cpu=3)], priority=1)     # first in line
    ledger.set_waiting("ns/small/t0", [Resources(cpu=1)])
    ledger.set_waiting("ns/gpu/t0", [Resources(gpu=1)])
    assert not ledger.try_acquire("ns/small/t0", [Resources(cpu=1)])
    assert ledger.try_acquire("ns/gpu/t0", [Resources(gpu=1)])


def test_the_hand_over_is_counted():
    waiting = [f"ns{i}/e{i}/t0" for i in range(3)]
    ledger, holders, woken = _full(2, waiting)
    for owner in holders:
        ledger.release(owner)
    assert ledger.try_acquire(waiting[1], CPU) and ledger.try_acquire(waiting[0], CPU)
    assert not ledger.try_acquire(waiting[2], CPU)
    assert ledger.work["wakes"] == len(woken) == 2
    assert ledger.work["grants"] == 4 and ledger.work["refused_full"] >= 1
