"""Coalescing of status writes: a phase change is written at once, anything else
(metrics, iteration, history) at most once per ``interval`` per object.

Pure bookkeeping with an injected clock; the controller does the writing."""
from __future__ import annotations

from typing import Any, Mapping


class WriteCoalescer:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._written: dict[str, Mapping[str, Any]] = {}
        self._written_at: dict[str, float] = {}
        self._wanted: dict[str, Mapping[str, Any]] = {}

    def want(self, key: str, status: Mapping[str, Any]) -> None:
        """Record the status ``key`` should have; cheap, call it as often as needed."""
        if self._written.get(key) == status:
            self._wanted.pop(key, None)
        else:
            self._wanted[key] = status

    def can_wait(self, key: str, phase: Any, now: float) -> bool:
        """True if a new status of ``key`` in ``phase`` would not be due yet: the caller
        may put off building it."""
        written = self._written.get(key)
        return (written is not None and written.get("phase") == phase
                and now - self._written_at.get(key, float("-inf")) < self.interval)

    def forget(self, key: str) -> None:
        for table in (self._written, self._written_at, self._wanted):
            table.pop(key, None)

    def seed(self, key: str, status: Mapping[str, Any], now: float) -> None:
        """Note what is already persisted (after a restart) so it is not rewritten."""
        self._written[key] = status
        self._written_at[key] = now

    def due(self, now: float, *, force: bool = False) -> list[tuple[str, Mapping[str, Any]]]:
        """The writes to make now: phase changes and anything whose interval elapsed."""
        ready = []
        for key, status in self._wanted.items():
            previous = self._written.get(key) or {}
            phase_changed = status.get("phase") != previous.get("phase")
            elapsed = now - self._written_at.get(key, float("-inf"))
            if force or phase_changed or elapsed >= self.interval:
                ready.append((key, status))
        return ready

    def written(self, key: str, status: Mapping[str, Any], now: float) -> None:
        self._written[key] = status
        self._written_at[key] = now
        if self._wanted.get(key) == status:
            del self._wanted[key]

    @property
    def pending(self) -> bool:
        return bool(self._wanted)
