"""The node types the Ray autoscaler may add, read without holding up placement.

Reading them runs a task on the head node (autoscaler.py).  On a busy head (an operator
restarted beside dozens of trial actors whose worker processes are starting) that task
waited 30 s and more, measured at restart in tests/integration/test_scale.py, and while
the first read was under way the platform placed nothing at all: its capacity refresh
waited for it, and a timeout counted as "cannot reach Ray".  Here the read runs beside
placement: the first capacity refresh waits at most ``FIRST_WAIT_S`` for it (a quiet
head answers in about a second), then places what fits the nodes there are while the
read goes on; the ledger calls nothing infeasible until the node types are known
(``ResourceLedger.set_capacity(growth_known=False)``) nor asked of the autoscaler (a
request for what no node type offers would be withdrawn moments later).  A failed read is retried with
backoff, and a known answer is kept until a newer one arrives."""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from kubetune.core.backoff import Backoff
from kubetune.core.resources import Resources

log = logging.getLogger(__name__)

FIRST_WAIT_S = 10.0
MAX_BACKOFF_S = 30.0


class GrowthReader:
    """The last node types read for one connection, and the read under way."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.known = False
        self.shapes: list[Resources] | None = None
        self.error = ""          # why the last read failed ("" once one succeeded)
        self._task: asyncio.Task | None = None
        self._retry = Backoff(first_s=1.0, max_s=MAX_BACKOFF_S)

    async def current(self, read: Callable[[], Awaitable[list[Resources] | None]],
                      wait_s: float | None = None) -> tuple[bool, list[Resources] | None]:
        """(known, shapes): starts a read if none is under way (each refresh: once known,
        the executor answers from its own cache, NodeTypes), and waits for it up to
        ``wait_s`` (default ``FIRST_WAIT_S``; a connect's refresh) while nothing is known
        yet.  Other refreshes pass 0: they run under the platform's lock, which every
        Experiment's step takes, and must not hold it while the head is slow."""
        if self._task is None and self._retry.due(self._clock()):
            self._task = asyncio.ensure_future(self._read(read))
        wait_s = FIRST_WAIT_S if wait_s is None else wait_s
        if not self.known and self._task is not None and wait_s > 0:
            await asyncio.wait({self._task}, timeout=wait_s)
        return self.known, self.shapes

    async def _read(self, read: Callable[[], Awaitable[list[Resources] | None]]) -> None:
        try:
            shapes = await read()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - any failure: retried, placement goes on
            wait_s = self._retry.failed(self._clock())
            log.warning("cannot read the autoscaler's node types yet (next attempt in %.0fs): %s", wait_s, error)
            self.error = f"{type(error).__name__}: {error}"[:200]     # said in queued trials' words
        else:
            self.known, self.shapes, self.error = True, shapes, ""
            self._retry.reset()
        finally:
            if self._task is asyncio.current_task():    # not a read forget() cancelled
                self._task = None

    def forget(self) -> None:
        """A new connection: what the last one read no longer counts."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.known, self.shapes, self.error = False, None, ""
        self._retry.reset()
