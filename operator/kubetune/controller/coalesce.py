"""Coalescing of status writes: a phase change is written at once, anything else
(metrics, iteration, history) at most once per ``interval`` per object.  With
``start_delay``, a change *to* ``start_phase`` (a trial starting to run) waits that
long while there is nothing else to show (no ``history`` yet): a trial that ends
within it gets one write, its final status, instead of two.

Pure bookkeeping with an injected clock; the controller does the writing."""
from __future__ import annotations

from typing import Any, Mapping


class WriteCoalescer:
    def __init__(self, interval: float, *, start_phase: str | None = None, start_delay: float = 0.0) -> None:
        self.interval = interval
        self.start_phase = start_phase
        self.start_delay = start_delay
        self._started_at: dict[str, float] = {}     # first seen wanting start_phase
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

    def last_written(self, key: str) -> Mapping[str, Any]:
        """What was last written (or seeded) for ``key``; {} if nothing."""
        return self._written.get(key) or {}

    def forget(self, key: str) -> None:
        for table in (self._written, self._written_at, self._wanted, self._started_at):
            table.pop(key, None)

    def seed(self, key: str, status: Mapping[str, Any], now: float) -> None:
        """Note what is already persisted (after a restart) so it is not rewritten."""
        self._written[key] = status
        self._written_at[key] = now

    def due(self, now: float, *, force: bool = False) -> list[tuple[str, Mapping[str, Any]]]:
        """The writes to make now: phase changes and anything whose interval elapsed.

        Those to ``start_phase`` come last: a trial that ended and the one that took its
        slot are written in that order, so a reader listing the Trials between the two
        writes never sees more of them running than ran at once (test_queueing samples
        Running Trials against the GPUs present)."""
        ready = []
        for key, status in self._wanted.items():
            previous = self._written.get(key) or {}
            phase_changed = status.get("phase") != previous.get("phase")
            if (phase_changed and self.start_delay > 0 and status.get("phase") == self.start_phase
                    and not status.get("history")):
                since = self._started_at.setdefault(key, now)
                if not force and now - since < self.start_delay:
                    continue
                ready.append((key, status))
                continue
            elapsed = now - self._written_at.get(key, float("-inf"))
            if force or phase_changed or elapsed >= self.interval:
                ready.append((key, status))
        if self.start_phase is None:
            return ready
        return sorted(ready, key=lambda item: item[1].get("phase") == self.start_phase)     # stable

    def written(self, key: str, status: Mapping[str, Any], now: float) -> None:
        """``status`` was written: the newest there is, it replaces whatever was wanted
        (a write outside ``due``, such as one ahead of a stop, must not be followed by an
        older status still waiting here)."""
        self._written[key] = status
        self._written_at[key] = now
        self._started_at.pop(key, None)
        self._wanted.pop(key, None)

    @property
    def pending(self) -> list[str]:
        """The keys with a status still to write."""
        return list(self._wanted)


def differs_beyond(written: Mapping[str, Any], status: Mapping[str, Any], volatile: tuple[str, ...]) -> bool:
    """True if ``status`` says anything ``written`` does not, leaving out the ``volatile``
    top-level fields (figures that move with every result: a change of them alone can
    wait for a longer interval, or go out with the next change that matters)."""
    keys = (set(written) | set(status)) - set(volatile)
    return any(written.get(key) != status.get(key) for key in keys)
