"""Leader election rules over a coordination.k8s.io Lease, as client-go's leaderelection:
pure decisions; ``k8s/lease.py`` reads and writes the Lease.

A candidate takes the Lease when nobody holds it, or when its record has not changed
for ``leaseDurationSeconds`` as measured by the candidate's own clock since it first
saw that record (clocks of different nodes are never compared). The leader renews it
every ``retry_period``; a leader that could not renew within ``renew_deadline`` (shorter
than the lease) must stop at once, before any other replica may take over."""
from __future__ import annotations

import dataclasses

LEASE_DURATION_S = 8.0     # a standby waits this long after the last renewal it saw
RENEW_DEADLINE_S = 5.0     # a leader that could not renew for this long stops
RETRY_PERIOD_S = 1.0       # renewals and attempts to acquire


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    holder: str                 # "" when released
    duration_s: float
    renew_time: str             # as written by the holder (opaque here: only compared for change)
    transitions: int
    version: str                # resourceVersion: writes are conditional on it


@dataclasses.dataclass
class Observation:
    """What this candidate last saw of the Lease and when (its monotonic clock)."""
    record: LeaseRecord | None = None
    seen_at: float = 0.0

    def note(self, record: LeaseRecord | None, now: float) -> None:
        if record is None or self.record is None or (record.holder, record.renew_time) != (
                self.record.holder, self.record.renew_time):
            self.seen_at = now
        self.record = record


def may_take(record: LeaseRecord | None, observation: Observation, identity: str, now: float) -> bool:
    """Whether ``identity`` may write itself into the Lease now."""
    if record is None or not record.holder or record.holder == identity:
        return True
    return now - observation.seen_at >= record.duration_s


def transitions_after(record: LeaseRecord | None, identity: str) -> int:
    if record is None:
        return 0
    return record.transitions + (record.holder != identity)
