"""Writes the API server refused, per object: retried with backoff, surfaced when they
keep failing (issue 14: one refused Trial write used to abort the whole reconcile and
freeze the Experiment).

Pure bookkeeping with an injected clock.  An object whose write failed waits
``backoff`` before the next try, while every other object is written as usual.  After
``SURFACE_AFTER`` failures in a row (at once for a refusal that retrying will not
cure, such as 422 Invalid or 403 Forbidden) it shows on the Experiment as the
``StatusWriteFailed`` condition with the API's reason, and as one Warning Event."""
from __future__ import annotations

from dataclasses import dataclass

from kubetune.core.backoff import exponential
from kubetune.k8s.errors import WriteRefused

SURFACE_AFTER = 3
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


def backoff(failures: int) -> float:
    return exponential(failures, FIRST_BACKOFF_S, MAX_BACKOFF_S)


@dataclass
class _Failing:
    count: int
    retry_at: float
    error: WriteRefused
    surfaced: bool = False


class WriteFailures:
    def __init__(self) -> None:
        self._failing: dict[str, _Failing] = {}

    def ready(self, key: str, now: float) -> bool:
        """May ``key`` be written now (no failure, or its backoff is over)?"""
        failing = self._failing.get(key)
        return failing is None or now >= failing.retry_at

    def failed(self, key: str, error: WriteRefused, now: float) -> bool:
        """Record a refusal; True when it is to be surfaced now (a Warning Event)."""
        previous = self._failing.get(key)
        count = previous.count + 1 if previous else 1
        failing = _Failing(count, now + backoff(count), error, previous.surfaced if previous else False)
        self._failing[key] = failing
        if not failing.surfaced and (count >= SURFACE_AFTER or not error.transient):
            failing.surfaced = True
            return True
        return False

    def hopeless(self, key: str) -> bool:
        """Is ``key`` refused in a way retrying will not cure (422 Invalid, 403 Forbidden)?"""
        failing = self._failing.get(key)
        return failing is not None and not failing.error.transient

    def succeeded(self, key: str) -> None:
        self._failing.pop(key, None)

    def forget(self, key: str) -> None:
        self._failing.pop(key, None)

    @property
    def failing(self) -> bool:
        return bool(self._failing)

    def condition(self) -> tuple[str, str] | None:
        """(reason, message) of the StatusWriteFailed condition, or None when every
        surfaced write went through since."""
        surfaced = [(key, f) for key, f in self._failing.items() if f.surfaced]
        if not surfaced:
            return None
        key, failing = surfaced[0]
        error = failing.error
        more = f" (and {len(surfaced) - 1} more objects)" if len(surfaced) > 1 else ""
        return (error.reason or "WriteRefused",
                f"{key}: the API server refused the status write {failing.count} times{more}: "
                f"{error.status} {error.reason}: {error.message}; retrying with backoff")
