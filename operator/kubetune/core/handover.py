"""Who may take the room that is free now, and whose Experiment to wake (issue 26).

The ledger (core/resources.py) keeps its waiting requests in fair order
(core/fair_share.py).  Freed room used to go to the first fitting request alone: only
its Experiment was woken, everyone behind was refused until it had taken its slot at
the pace of its own cycle, and only then was the next one woken.  With 200 Experiments
sharing a cluster that handed over one or two slots a second while the rest sat idle.

``admit`` walks the line once, first in line first, and reserves room for every
request that fits what the ones ahead of it left: all of them may start now, each in
its own cycle, in any order.  A turn once given is kept until it is taken (or its
request leaves, or no longer fits): when one behind takes its slot first, the line is
rebuilt with that holding and may order the rest differently (a tie between namespaces
goes to the earlier arrival), and the one ahead must not lose the room it was told
about to a request that was behind it.  A request ahead that does not fit blocks the kinds it is
short of, so nobody behind that asks for one of them overtakes it (it would starve);
requests that need other kinds still backfill.  Requests kept back while other
Experiments start (``kept_for_starting``) neither reserve nor block.  Pure.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Mapping

from kubetune.core.fair_share import groups, kept_for_starting
from kubetune.core.feasibility import first_fit, short_kinds, total_of
from kubetune.spec.resources import Resources


@dataclass
class Admission:
    owners: dict[str, int]       # the requests that may start now -> their place in line, first first
    free: list[Resources]        # per node, what is left once they are placed (where the walk stopped)
    blocked: set[str]            # kinds a request ahead is short of: nobody behind asking one may start


def admit(queue: list[tuple[str, Any]], node_free: list[Resources], asked: Collection[str],
          starting: Collection[str] = (), holding: Collection[str] = (), until: int | None = None,
          given: Iterable[str] = (), waiting: Mapping[str, Any] | None = None) -> Admission:
    """The line ``queue`` (owner, Waiting) up to place ``until``: who may start now.
    ``asked``: every kind the line asks for (once all are blocked, the rest of the line is);
    ``starting``/``holding``: Experiments being built, and those holding room now;
    ``given``: the owners told earlier that they may start (``waiting``: owner -> Waiting),
    served first while they still wait, fit, and are not kept for starters."""
    free = list(node_free)
    holders = set(holding) if starting else set()
    admitted: dict[str, int] = {}
    blocked: set[str] = set()

    def fits(owner: str, entry: Any) -> bool:
        request = entry.request_of(owner)
        if starting and kept_for_starting(request.experiment, starting, holders):
            return False
        placement = first_fit(entry.bundles, free)
        if placement is None:
            return False
        for index, bundle in zip(placement, entry.bundles):
            free[index] = free[index] - bundle
        admitted[owner] = -1
        holders.add(request.experiment)
        return True

    for owner in given:
        entry = (waiting or {}).get(owner)
        if entry is not None:
            fits(owner, entry)
    for place, (owner, entry) in enumerate(itertools.islice(queue, until)):
        if blocked.issuperset(asked):
            break
        if owner in admitted or entry.request_of(owner).kinds & blocked:
            continue
        if fits(owner, entry):
            admitted[owner] = place
        elif not (starting and kept_for_starting(entry.request_of(owner).experiment, starting, holders)):
            # never empty (short_kinds): each request that does not fit blocks a kind more
            blocked |= short_kinds(entry.bundles, free, lambda: total_of(free))
    return Admission(admitted, free, blocked)


def may_follow(admission: Admission, bundles: list[Resources]) -> bool:
    """Whether a request behind the walk's end may start: not short of a kind someone
    ahead waits for, and it fits what the admitted ones left."""
    kinds = {kind for bundle in bundles for kind in bundle.kinds()}
    return not kinds & admission.blocked and first_fit(bundles, admission.free) is not None


class Turns:
    """Each watching Experiment's wake; the requests whose turn it is (``given``: kept
    until taken, see the module's words); those whose Experiment was told so (once each,
    until they start, leave, or are told again at a refresh of the cluster's shape)."""

    def __init__(self) -> None:
        self.wakers: dict[str, Callable[[], None]] = {}   # experiment ("ns/exp/") -> wake its runner
        self.given: dict[str, None] = {}       # ordered: the first given first
        self.woken: set[str] = set()

    def wake(self, admitted: Mapping[str, int]) -> int:
        """Wake the Experiment of each admitted request not told yet, first in line first;
        how many wakes that was (an Experiment with several such requests: one)."""
        self.woken.intersection_update(admitted)
        experiments: dict[str, None] = {}
        for owner in admitted:
            if owner not in self.woken:
                self.woken.add(owner)
                experiments[groups(owner)[1]] = None
        wakes = 0
        for experiment in experiments:
            wake = self.wakers.get(experiment)
            if wake is not None:
                wakes += 1
                wake()
        return wakes
