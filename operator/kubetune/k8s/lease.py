"""Leader election on a coordination.k8s.io Lease (rules: core/leadership.py).

``kubetune operator --leader-election`` runs ``LeaderElector.acquire`` before kopf
starts: a standby replica waits there (serving its health endpoint), so exactly one
replica watches Experiments and drives trials. The leader renews in the background
and, if it cannot renew in time, ends its process at once (``on_lost``) — before the
lease can expire for a standby — so two replicas never drive at the same time.

Renewal runs on a thread of its own with an API client of its own, never on the event
loop or its default thread pool: whatever the controllers do there (one tenant's
Experiment at parallelism 1,000, a slow Ray call) cannot starve it (issue 25, N7)."""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
import time
from typing import Callable

import kubernetes
from kubernetes.client.exceptions import ApiException

from kubetune.core.leadership import (LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S, LeaseRecord,
                                      Observation, may_take, transitions_after)

log = logging.getLogger(__name__)


def _now_micro() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, namespace: str, name: str, identity: str, *,
                 lease_duration_s: float = LEASE_DURATION_S, renew_deadline_s: float = RENEW_DEADLINE_S,
                 retry_period_s: float = RETRY_PERIOD_S) -> None:
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.leading = False
        self._observation = Observation()
        self._api = kubernetes.client.CoordinationV1Api()
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        self._request_timeout: float | None = None    # per API call while renewing (the deadline)

    async def acquire(self) -> None:
        """Return once this replica holds the Lease."""
        logged = False
        while not await asyncio.to_thread(self._try_acquire_or_renew):
            if not logged:
                holder = self._observation.record.holder if self._observation.record else "?"
                log.info("standby: %s/%s is held by %s", self.namespace, self.name, holder)
                logged = True
            await asyncio.sleep(self.retry_period_s)
        self.leading = True
        log.info("leading: %s holds %s/%s", self.identity, self.namespace, self.name)

    def keep_renewing(self, on_lost: Callable[[str], None]) -> None:
        """Renew every retry period, on a thread of its own; ``on_lost`` (called on that
        thread) when no renewal succeeded for the deadline."""
        self._api = kubernetes.client.CoordinationV1Api(kubernetes.client.ApiClient())   # not shared
        # a renewal that takes longer than the deadline is no renewal
        self._request_timeout = self.renew_deadline_s
        self._renewer = threading.Thread(target=self._renew_loop, args=(on_lost,), daemon=True,
                                         name="lease-renewal")
        self._renewer.start()

    def _renew_loop(self, on_lost: Callable[[str], None]) -> None:
        renewed_at = time.monotonic()
        while not self._stop.wait(self.retry_period_s):
            try:
                held = self._try_acquire_or_renew()
            except Exception as error:  # noqa: BLE001 - the API is unreachable: try again until the deadline
                log.warning("cannot renew the lease %s/%s: %s", self.namespace, self.name, error)
                held = None
            if held:
                renewed_at = time.monotonic()
            elif held is False or time.monotonic() - renewed_at >= self.renew_deadline_s:
                self.leading = False
                holder = self._observation.record.holder if self._observation.record else "?"
                if not self._stop.is_set():
                    on_lost(f"lost the lease {self.namespace}/{self.name} (held by {holder})"
                            if held is False else f"could not renew the lease for {self.renew_deadline_s:.0f}s")
                return

    async def release(self) -> None:
        """Give the Lease up (a clean shutdown): a standby takes over at once."""
        self._stop.set()
        if self._renewer is not None:
            await asyncio.to_thread(self._renewer.join, self.renew_deadline_s)
        if not self.leading:
            return
        self.leading = False
        try:
            await asyncio.to_thread(self._write, self._observation.record, holder="")
        except Exception as error:  # noqa: BLE001 - it expires on its own
            log.warning("cannot release the lease %s/%s: %s", self.namespace, self.name, error)

    # ------------------------------------------------------------------ API (in threads)

    def _try_acquire_or_renew(self) -> bool:
        record = self._read()
        now = time.monotonic()
        self._observation.note(record, now)
        if not may_take(record, self._observation, self.identity, now):
            return False
        try:
            self._write(record, holder=self.identity)
        except ApiException as error:
            if error.status in (409, 422):    # another replica wrote first
                return False
            raise
        return True

    def _read(self) -> LeaseRecord | None:
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace, **self._timeout())
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        spec = lease.spec
        renew = spec.renew_time.isoformat() if spec.renew_time is not None else ""
        return LeaseRecord(holder=spec.holder_identity or "", duration_s=float(spec.lease_duration_seconds or 0),
                           renew_time=renew, transitions=int(spec.lease_transitions or 0),
                           version=lease.metadata.resource_version)

    def _write(self, record: LeaseRecord | None, *, holder: str) -> None:
        now = _now_micro()
        spec = {"holderIdentity": holder, "leaseDurationSeconds": max(1, round(self.lease_duration_s)),
                "renewTime": now, "leaseTransitions": transitions_after(record, holder)}
        if record is None or record.holder != holder:
            spec["acquireTime"] = now
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}
        if record is None:
            self._api.create_namespaced_lease(self.namespace, body, **self._timeout())
        else:
            # conditional on the version read: of two replicas writing at once, one wins
            body["metadata"]["resourceVersion"] = record.version
            self._api.replace_namespaced_lease(self.name, self.namespace, body, **self._timeout())

    def _timeout(self) -> dict:
        return {"_request_timeout": self._request_timeout} if self._request_timeout else {}


async def serve_health(port: int, path: str, ready: Callable[[], bool]):
    """``path`` (liveness: the loop answers) and ``/readyz`` (200 only while leading, so
    Services such as the result ingest reach the leader only); returns the aiohttp runner."""
    from aiohttp import web

    async def alive(_request: web.Request) -> web.Response:
        return web.json_response({"alive": True})

    async def readiness(_request: web.Request) -> web.Response:
        return web.json_response({"leading": ready()}, status=200 if ready() else 503)

    app = web.Application()
    app.router.add_get(path, alive)
    app.router.add_get("/readyz", readiness)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner
