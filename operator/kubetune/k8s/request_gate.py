"""Which of the operator's waiting API requests goes next (issue 26).

The operator's API requests run in a pool of threads (k8s/store.py); when all are busy,
the rest wait.  In a pool's own queue they went first come, first served: 200
Experiments applied at once each wrote their first status after creating their first
Trial, and the Experiments built later waited seconds for their first Trial behind
those status writes (measured: 2-5 s for a thread, at 0.2-1 s a request under load).
Here, at most ``size`` requests are in flight, and a waiting request of a smaller
``priority`` number goes first (same priority: in order of arrival).  What gets an
Experiment going (``PROGRESS``: its LIST, its Trials created) goes before what records
how it goes (``RECORD``: status writes, coalesced anyway, a later one carrying the
latest state).  Nothing is dropped.

Aging: a request that has waited ``max_wait_s`` goes before every request that came
after it, whatever their priority.  Without it, a long stream of LISTs and creates (a
restart restoring every Experiment, a burst of hundreds) held every status write back
for as long as the stream lasted, and ``kubectl get`` showed a state that long gone.
The bound is longer than a burst's creates wait (2-10 s measured for 200 Experiments
on 2 loaded cores), so that aged status writes do not go before the last Experiments'
first Trials; it bounds how stale a status gets under a stream that lasts longer."""
from __future__ import annotations

import asyncio
import collections
import itertools
import time
from typing import Callable

PROGRESS = 0    # LISTs of an Experiment's Trials, Trial creates
RECORD = 1      # status writes, Events, metadata strips
MAX_WAIT_S = 15.0   # past this, a waiting request goes in order of arrival, not of priority


class RequestGate:
    def __init__(self, size: int, max_wait_s: float = MAX_WAIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        if size < 1:
            raise ValueError(f"a gate needs room for a request, got size {size}")
        self.size = size
        self.busy = 0
        self.max_wait_s = max_wait_s
        self._clock = clock
        # priority -> waiting (arrival number, arrived at, turn), in order of arrival
        self._waiting: dict[int, collections.deque[tuple[int, float, asyncio.Future]]] = {}
        self._order = itertools.count()

    async def enter(self, priority: int) -> None:
        """Wait for a place; the caller ``leave``s when its request is answered."""
        if self.busy < self.size and not self._heads():
            self.busy += 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(priority, collections.deque()).append((next(self._order), self._clock(), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave()      # handed a place as it was cancelled: pass it on
            raise

    def leave(self) -> None:
        """A request is answered: its place goes to the one waiting longest if it has
        waited ``max_wait_s``, else to the first waiting by priority."""
        turn = self._next()
        if turn is None:
            self.busy -= 1
        else:
            turn.set_result(None)

    def _heads(self) -> list[tuple[int, collections.deque]]:
        """The non-empty queues by priority, each with a live request first."""
        heads = []
        for priority in sorted(self._waiting):
            queue = self._waiting[priority]
            while queue and queue[0][2].done():    # cancelled while it waited
                queue.popleft()
            if queue:
                heads.append((priority, queue))
        return heads

    def _next(self) -> asyncio.Future | None:
        heads = self._heads()
        if not heads:
            return None
        oldest = min(heads, key=lambda head: head[1][0][0])
        aged = self._clock() - oldest[1][0][1] >= self.max_wait_s
        _, queue = oldest if aged else heads[0]
        return queue.popleft()[2]

    @property
    def waiting(self) -> int:
        return sum(1 for queue in self._waiting.values() for _, _, turn in queue if not turn.done())
