"""The Lease is renewed on a thread of its own (issue 25, N7): an event loop kept busy by
the controllers (one tenant's Experiment at parallelism 1,000) cannot starve it.  The
API calls are replaced by a counter here; tests/integration/test_leader_election.py runs
the real Lease on the real API server."""
from __future__ import annotations

import asyncio
import time

from kubetune.k8s.lease import LeaderElector


def test_renewals_go_on_while_the_event_loop_is_blocked():
    elector = LeaderElector("ns", "lease", "me", lease_duration_s=0.8, renew_deadline_s=0.5, retry_period_s=0.05)
    renewals, lost = [], []
    elector._try_acquire_or_renew = lambda: renewals.append(time.monotonic()) or True

    async def starve_the_loop() -> None:
        elector.keep_renewing(lost.append)
        deadline = time.monotonic() + 60
        while len(renewals) < 5 and time.monotonic() < deadline:
            pass        # the loop is held: no await, as a long synchronous cycle holds it
        await elector.release()

    asyncio.run(starve_the_loop())
    assert len(renewals) >= 5 and not lost
