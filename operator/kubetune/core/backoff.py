"""Exponential backoff for a retried call, on an injected clock (pure: no sleeping).

    retry = Backoff(first_s=1.0, max_s=30.0)
    if retry.due(now): ...try...; on failure: wait_s = retry.failed(now); on success: retry.reset()

Used where an outage must not become a crash loop nor a flood: reconnecting to a cluster,
reading what its autoscaler can add, and writes the API server refused.
"""
from __future__ import annotations


def exponential(failures: int, first_s: float, max_s: float) -> float:
    """The wait after ``failures`` failures in a row (1: ``first_s``), doubling up to ``max_s``.
    The exponent stops growing long after the cap is reached: an outage of days must not
    overflow the float it doubles (2.0 ** 1024 raises)."""
    return min(first_s * 2.0 ** min(max(failures - 1, 0), 64), max_s)


class Backoff:
    def __init__(self, first_s: float = 1.0, max_s: float = 30.0) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.reset()

    def reset(self) -> None:
        """A success: the next failure waits ``first_s`` again, and nothing waits now."""
        self.failures = 0
        self.retry_at = float("-inf")

    def due(self, now: float) -> bool:
        return now >= self.retry_at

    def failed(self, now: float) -> float:
        """One more failure at ``now``: returns how long until the next attempt."""
        self.failures += 1
        wait_s = exponential(self.failures, self.first_s, self.max_s)
        self.retry_at = now + wait_s
        return wait_s

    def hold(self, now: float) -> None:
        """A failure seen elsewhere (a call that lost the cluster): wait the current step
        again before the next attempt, without lengthening the steps after it."""
        self.retry_at = now + exponential(self.failures, self.first_s, self.max_s)
