"""Client-side rate limit of the operator's own API requests (issue 26): a token bucket
of ``qps`` tokens a second holding at most ``burst``, as client-go's QPS and Burst.

Every request of the Experiment controllers' store (k8s/store.py: Trial creates, status
patches, LISTs, Events) takes a token first, waiting on the event loop, not in a
thread, when none is left: 200 Experiments finishing at once queue their writes here
instead of at the API server.  One bucket per operator process, set from the operator's
settings (``--kube-api-qps``, ``--kube-api-burst``) at startup."""
from __future__ import annotations

import asyncio
import time
from typing import Callable

DEFAULT_QPS = 50.0
DEFAULT_BURST = 100


class TokenBucket:
    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not (qps > 0 and burst >= 1):
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, got {qps}, {burst}")
        self.qps, self.burst = float(qps), int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self.waited = 0          # requests that had to wait for a token (metrics, tests)

    def delay(self) -> float:
        """Take a token: 0 if one was there, else how long until the one taken is due
        (tokens go negative: each waiter is given its own future slot, in order)."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        self.waited += 1
        return -self._tokens / self.qps

    async def acquire(self) -> None:
        wait = self.delay()
        if wait > 0:
            await asyncio.sleep(wait)


_bucket = TokenBucket(DEFAULT_QPS, DEFAULT_BURST)


def configure(qps: float, burst: int) -> None:
    global _bucket
    _bucket = TokenBucket(qps, burst)


def bucket() -> TokenBucket:
    return _bucket


async def acquire() -> None:
    """Wait for this process' next request token."""
    await _bucket.acquire()
