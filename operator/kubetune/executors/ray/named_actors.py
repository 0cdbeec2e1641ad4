"""One listing of a cluster's named actors, shared by every Experiment that asks within
``max_age_s`` (see executors/ray/discovery.py, which reads it).

Listing the named actors is one GCS call that returns every named actor of the
cluster: hundreds when many Experiments share it.  Each Experiment asks for it every
reconcile period and after each stop (controller/runs.py), so a listing per question
costs O(Experiments x actors) per period (issue 26: 10-12% of a busy operator's CPU
at 200 Experiments).  Here one listing serves every question for ``max_age_s``, and
while one thread fetches it the others wait for that fetch rather than make their own.

A shared listing is older than the question, which is safe both ways for discovery:

- an actor this executor ends (``killed``) is left out of any listing fetched before
  the kill, so a reconcile right after a stop never sees the stopped actor as alive
  (no better than an unshared listing: Ray ends an actor asynchronously);
- an actor created since is missing until the next fetch.  Discovery only adopts the
  actors it does not know, and the executor knows the ones it created; another
  process's (before a restart) were alive before this executor's first fetch.

Where a missing actor would be lost (ending every actor of a deleted Experiment,
counting what is left), the caller asks ``fresh``: a listing fetched after the
question, with nothing left out.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

MAX_AGE_S = 1.0


@dataclass(frozen=True)
class Listing:
    """Named actors as (Ray namespace, name) pairs, fetched when kill number ``epoch`` was next."""
    actors: tuple[tuple[str, str], ...]
    fetched_at: float
    epoch: int
    by_group: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


class NamedActors:
    """The named actors of one cluster (one connection), fetched by ``fetch`` and shared.

    ``fetch()`` returns dicts with ``name`` and ``namespace`` (``ray.util.list_named_actors
    (all_namespaces=True)``); ``group(name)`` says which index entry a name belongs to
    (None: none), so that one group's actors are found without scanning all.  Thread-safe."""

    def __init__(self, fetch: Callable[[], Iterable[dict[str, Any]]], group: Callable[[str], str | None],
                 *, max_age_s: float = MAX_AGE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._group = group
        self.max_age_s = max_age_s
        self._clock = clock
        self._cond = threading.Condition()
        self._listing: Listing | None = None
        self._fetching = False
        self._epoch = 0                       # kills so far: a listing fetched before kill n shows n's actor
        self._killed: dict[str, int] = {}     # name -> epoch of its kill, until a later fetch began
        self.fetches = 0                      # listings fetched (the benchmark's and tests' evidence)
        self.waiting = 0                      # questions waiting now for the fetch under way

    def killed(self, name: str) -> None:
        """This executor ended actor ``name``: listings fetched before now leave it out."""
        with self._cond:
            self._killed[name] = self._epoch
            self._epoch += 1

    def actors(self, group: str | None = None, *, fresh: bool = False) -> list[tuple[str, str]]:
        """(namespace, name) of the live named actors (of ``group`` only, if given).

        ``fresh``: fetched after this call began, with nothing left out (Ray's own word)."""
        if fresh:
            listing = self._fetch_listing()
            return list(listing.by_group.get(group, ()) if group is not None else listing.actors)
        listing = self._shared()
        with self._cond:
            killed = {name for name, epoch in self._killed.items() if epoch >= listing.epoch}
        chosen = listing.by_group.get(group, ()) if group is not None else listing.actors
        return [actor for actor in chosen if actor[1] not in killed]

    def groups(self) -> list[str]:
        """The groups that have actors in the shared listing."""
        return sorted(self._shared().by_group)

    def _shared(self) -> Listing:
        """A listing no older than ``max_age_s``: the current one, the one being fetched, or a new one."""
        with self._cond:
            while True:
                listing = self._listing
                if listing is not None and self._clock() - listing.fetched_at <= self.max_age_s:
                    return listing
                if not self._fetching:
                    self._fetching = True     # this thread fetches; the others wait for it
                    break
                self.waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self.waiting -= 1
        return self._fetch_listing(shared=True)

    def _fetch_listing(self, shared: bool = False) -> Listing:
        with self._cond:
            started, epoch = self._clock(), self._epoch
        listing = None
        try:
            listing = self._list(started, epoch)
        finally:
            with self._cond:
                if shared:
                    self._fetching = False
                if listing is not None:
                    self.fetches += 1
                    self._keep(listing)
                self._cond.notify_all()   # waiters take this listing, or one fetches if it failed
        return listing

    def _list(self, started: float, epoch: int) -> Listing:
        actors = tuple((str(a["namespace"]), str(a["name"])) for a in self._fetch())
        by_group: dict[str, list[tuple[str, str]]] = {}
        for actor in actors:
            key = self._group(actor[1])
            if key is not None:
                by_group.setdefault(key, []).append(actor)
        return Listing(actors, started, epoch, {k: tuple(v) for k, v in by_group.items()})

    def _keep(self, listing: Listing) -> None:
        """Share ``listing`` unless a later one is shared already (under the lock)."""
        current = self._listing
        if current is not None and (current.epoch, current.fetched_at) > (listing.epoch, listing.fetched_at):
            return
        self._listing = listing
        # a kill before this fetch began is Ray's to show from now on: forget it
        self._killed = {name: e for name, e in self._killed.items() if e >= listing.epoch}
