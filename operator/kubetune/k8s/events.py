"""Events on Experiments and Trials (``kubectl describe``), posted in the background
through the operator's rate limit and request gate (issue 26).

An Experiment's Events went through kopf's own client and queue: one Event object per
call, with no bound on how many wait, and outside the operator's QPS limit and request
gate, so 200 Experiments launching and ending trials took API capacity from Trial
creates. Here, as client-go's event recorder does:

- at most ``MAX_PENDING`` Events wait; past that an Event is dropped and counted
  (``kubetune_events_dropped_total``), as client-go's broadcaster drops when its channel
  is full. Events are a record for people, not the state: status and conditions are;
- the same Event (object, type, reason, message) again while the first still waits is
  one Event with a count. Again after it was posted (within ``REPEAT_WINDOW_S``): the
  Event already there gets its ``count`` and ``lastTimestamp`` raised (a PATCH), so a
  Trial retried 100 times is one Event counted 100 times, not 100 objects in etcd;
- they go at the gate's RECORD priority, behind what gets Experiments going.

``EventQueue`` is the pure bookkeeping; ``EventPoster`` runs it on an event loop, with
workers that exist only while Events wait. Events still waiting when the operator stops
are lost, as kopf's and client-go's are: the state they tell of is in the status.
"""
from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from kubetune import metrics
from kubetune.core.sanitize import MAX_MESSAGE_BYTES, cap_text
from kubetune.k8s import rate_limit
from kubetune.k8s.client import EXPERIMENTS, GROUP, TRIALS, VERSION

log = logging.getLogger(__name__)

MAX_PENDING = 1000        # Events waiting to be posted, all Experiments together
RECENT = 4096             # Events remembered for counting repeats (client-go's cache size)
REPEAT_WINDOW_S = 600.0   # a repeat within this long raises the count (client-go's 10 min)
WORKERS = 2               # Events in flight at once
TIMEOUT_S = 30            # a hung connection is a lost Event, not a gate place held forever


@dataclass(frozen=True)
class Involved:
    """The object an Event is about. ``uid`` None: read when posting (a Trial's).
    ``owner``: the uid of its Experiment, so that a repeat is never counted on the Event
    of a deleted Trial of the same name (an Experiment deleted and created again)."""
    kind: str          # "Experiment" or "Trial"
    namespace: str
    name: str
    uid: str | None = None
    owner: str | None = None


@dataclass(frozen=True)
class EventKey:
    """What makes two Events the same one, counted."""
    involved: Involved
    type: str
    reason: str
    message: str


@dataclass
class Occurrences:
    count: int
    first: datetime.datetime
    last: datetime.datetime


@dataclass
class Posted:
    name: str              # the Event object's name
    count: int
    first: datetime.datetime
    posted_at: float       # the queue's clock


class EventQueue:
    """Events waiting (bounded, repeats merged) and those recently posted (for counting)."""

    def __init__(self, limit: int = MAX_PENDING, recent: int = RECENT, window_s: float = REPEAT_WINDOW_S) -> None:
        self.limit, self.recent, self.window_s = limit, recent, window_s
        self._pending: collections.OrderedDict[EventKey, Occurrences] = collections.OrderedDict()
        self._posted: collections.OrderedDict[EventKey, Posted] = collections.OrderedDict()
        self._in_flight: set[EventKey] = set()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, key: EventKey, at: datetime.datetime) -> bool:
        """Queue one occurrence; False if it was dropped (the queue is full)."""
        waiting = self._pending.get(key)
        if waiting is not None:
            waiting.count += 1
            waiting.last = at
            return True
        if len(self._pending) >= self.limit:
            self.dropped += 1
            return False
        self._pending[key] = Occurrences(1, at, at)
        return True

    def take(self) -> tuple[EventKey, Occurrences] | None:
        """The Event waiting longest whose like is not being posted (so that two workers
        never post or count the same Event at once), taken off the queue until ``done``."""
        for key in self._pending:
            if key not in self._in_flight:
                self._in_flight.add(key)
                return key, self._pending.pop(key)
        return None

    def done(self, key: EventKey) -> None:
        self._in_flight.discard(key)

    def previous(self, key: EventKey, now: float) -> Posted | None:
        """The same Event posted within the window (to count on), if any."""
        posted = self._posted.get(key)
        if posted is None or now - posted.posted_at > self.window_s:
            return None
        return posted

    def record(self, key: EventKey, posted: Posted) -> None:
        self._posted[key] = posted
        self._posted.move_to_end(key)
        while len(self._posted) > self.recent:
            self._posted.popitem(last=False)

    def forget(self, key: EventKey) -> None:
        self._posted.pop(key, None)


def _timestamp(at: datetime.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def post_one(custom_api: Any, key: EventKey, seen: Occurrences, previous: Posted | None) -> tuple[str, int, datetime.datetime]:
    """Post (or count on) one Event; blocking, run in an API thread. Returns the Event's
    name, its count and its first time."""
    core = CoreV1Api(custom_api.api_client)
    involved = key.involved
    if previous is not None:
        count = previous.count + seen.count
        try:
            core.patch_namespaced_event(previous.name, involved.namespace,
                                        {"count": count, "lastTimestamp": _timestamp(seen.last)},
                                        _request_timeout=TIMEOUT_S)
            return previous.name, count, previous.first
        except ApiException as error:
            if error.status != 404:     # gone (expired, deleted): post it anew below
                raise
    uid = involved.uid
    if uid is None:
        plural = TRIALS if involved.kind == "Trial" else EXPERIMENTS
        uid = custom_api.get_namespaced_custom_object(GROUP, VERSION, involved.namespace, plural,
                                                      involved.name, _request_timeout=TIMEOUT_S)["metadata"]["uid"]
    created = core.create_namespaced_event(involved.namespace, {
        "metadata": {"generateName": f"{involved.name}.", "namespace": involved.namespace},
        "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": involved.kind, "name": involved.name,
                           "namespace": involved.namespace, "uid": uid},
        "type": key.type, "reason": key.reason, "message": key.message,
        "source": {"component": "kubetune"}, "reportingComponent": "kubetune",
        "firstTimestamp": _timestamp(seen.first), "lastTimestamp": _timestamp(seen.last), "count": seen.count},
        _request_timeout=TIMEOUT_S)
    return created.metadata.name, seen.count, seen.first


class EventPoster:
    """Posts the queue's Events with ``limited`` (the store's admitted, gated API call)
    running ``send`` (``post_one``) on ``custom_api``."""

    def __init__(self, limited: Callable[..., Awaitable[Any]], custom_api: Any,
                 queue: EventQueue | None = None, clock: Callable[[], float] | None = None,
                 send: Callable[..., tuple[str, int, datetime.datetime]] = post_one) -> None:
        self._limited = limited
        self._api = custom_api
        self._send = send
        self.queue = queue or EventQueue()
        self._clock = clock or time.monotonic    # not the loop's: posters are kept per loop, weakly
        self._workers: set[asyncio.Task] = set()

    def post(self, involved: Involved, kind: str, reason: str, message: str) -> None:
        """Queue an Event; never waits, never raises."""
        key = EventKey(involved, kind, cap_text(reason, 128), cap_text(message, MAX_MESSAGE_BYTES))
        if not self.queue.put(key, datetime.datetime.now(datetime.timezone.utc)):
            metrics.event_dropped(kind, key.reason)
            if self.queue.dropped == 1 or self.queue.dropped % 1000 == 0:
                log.warning("%d Event(s) dropped so far: %d wait to be posted already", self.queue.dropped,
                            len(self.queue))
            return
        if len(self._workers) < min(WORKERS, len(self.queue)):
            worker = asyncio.get_running_loop().create_task(self._drain(), name="post-events")
            self._workers.add(worker)

    async def _drain(self) -> None:
        try:
            await self._post_all()
        finally:
            # in the same step as the empty take: a post() after it starts a worker anew
            self._workers.discard(asyncio.current_task())

    async def _post_all(self) -> None:
        while (taken := self.queue.take()) is not None:
            key, seen = taken
            previous = self.queue.previous(key, self._clock())
            try:
                if previous is None and key.involved.uid is None:
                    await rate_limit.acquire()     # two requests: a GET for the uid, then the Event
                name, count, first = await self._limited(self._send, self._api, key, seen, previous)
            except Exception as error:  # noqa: BLE001 - a lost Event must not stop anything
                self.queue.forget(key)
                log.warning("cannot post Event %s on %s %s/%s: %s", key.reason, key.involved.kind,
                            key.involved.namespace, key.involved.name, error)
                continue
            finally:
                self.queue.done(key)
            self.queue.record(key, Posted(name, count, first, self._clock()))
            metrics.event_posted(key.type, key.reason)
