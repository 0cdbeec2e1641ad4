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
latest state).  Nothing is dropped: a record waits only while progress is waiting."""
from __future__ import annotations

import asyncio
import heapq
import itertools

PROGRESS = 0    # LISTs of an Experiment's Trials, Trial creates
RECORD = 1      # status writes, Events, metadata strips


class RequestGate:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a gate needs room for a request, got size {size}")
        self.size = size
        self.busy = 0
        self._waiting: list[tuple[int, int, asyncio.Future]] = []
        self._order = itertools.count()

    async def enter(self, priority: int) -> None:
        """Wait for a place; the caller ``leave``s when its request is answered."""
        if self.busy < self.size and not self._waiting:
            self.busy += 1
            return
        turn = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), turn))
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.leave()      # handed a place as it was cancelled: pass it on
            raise

    def leave(self) -> None:
        """A request is answered: its place goes to the first waiting, by priority."""
        while self._waiting:
            _, _, turn = heapq.heappop(self._waiting)
            if not turn.done():       # not cancelled meanwhile
                turn.set_result(None)
                return
        self.busy -= 1

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, turn in self._waiting if not turn.done())
