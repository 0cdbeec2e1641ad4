"""Which waiting API request goes next (issue 26, k8s/request_gate.py): at most ``size`` in
flight; of those waiting, what gets an Experiment going (its Trials created) before what
records how it goes (status writes), each kind in order of arrival."""
from __future__ import annotations

import asyncio

import pytest

from kubetune.k8s.request_gate import PROGRESS, RECORD, RequestGate


def test_waiting_requests_go_by_priority_then_arrival():
    gate = RequestGate(size=1)
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        await gate.enter(priority)
        order.append(name)
        await asyncio.sleep(0)
        gate.leave()

    async def main():
        await gate.enter(RECORD)       # the only place is taken: everyone below waits
        tasks = [asyncio.ensure_future(request(name, priority)) for name, priority in
                 [("status-1", RECORD), ("create-1", PROGRESS), ("status-2", RECORD), ("create-2", PROGRESS)]]
        await asyncio.sleep(0)
        assert gate.waiting == 4 and order == []
        gate.leave()
        await asyncio.gather(*tasks)
    asyncio.run(main())
    assert order == ["create-1", "create-2", "status-1", "status-2"]
    assert gate.busy == 0


def test_no_more_than_size_in_flight():
    gate = RequestGate(size=3)
    in_flight, most = [0], [0]

    async def request(priority: int) -> None:
        await gate.enter(priority)
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.001)
        in_flight[0] -= 1
        gate.leave()

    async def main():
        await asyncio.gather(*(request(i % 2) for i in range(20)))
    asyncio.run(main())
    assert most[0] == 3 and gate.busy == 0


def test_a_waiter_cancelled_gives_its_place_on():
    gate = RequestGate(size=1)

    async def main():
        await gate.enter(RECORD)
        cancelled = asyncio.ensure_future(gate.enter(PROGRESS))
        later = asyncio.ensure_future(gate.enter(RECORD))
        await asyncio.sleep(0)
        cancelled.cancel()             # its Experiment deleted while it waited
        await asyncio.sleep(0)
        gate.leave()
        await asyncio.wait_for(later, 5)   # the place went past the cancelled one
        gate.leave()
    asyncio.run(main())
    assert gate.busy == 0 and gate.waiting == 0


def test_a_gate_needs_room():
    with pytest.raises(ValueError):
        RequestGate(size=0)


def test_a_request_waiting_past_the_bound_goes_before_later_ones_of_any_priority():
    now = [0.0]
    gate = RequestGate(size=1, max_wait_s=3.0, clock=lambda: now[0])
    order: list[str] = []

    async def request(name: str, priority: int) -> None:
        await gate.enter(priority)
        order.append(name)

    async def main():
        await gate.enter(PROGRESS)
        waiting = [asyncio.ensure_future(request("status", RECORD))]
        await asyncio.sleep(0)
        for i in range(4):             # a stream of creates: each arrives before the last is answered
            waiting.append(asyncio.ensure_future(request(f"create-{i}", PROGRESS)))
            await asyncio.sleep(0)
            now[0] += 1.0
            gate.leave()
            await asyncio.sleep(0)
        gate.leave()
        await asyncio.gather(*waiting)
        gate.leave()
    asyncio.run(main())
    # the status write waited 1, 2, then 3 s: from then on it goes first
    assert order == ["create-0", "create-1", "status", "create-2", "create-3"]
    assert gate.busy == 0
