"""The per-cluster ledger that decides who may start, over spec.resources.Resources
(the one resource type; re-exported here).

One ``ResourceLedger`` is shared by every Experiment on the same cluster: a
trial only launches when the ledger grants all of its bundles (a placement group
starts all or nothing), and what is waiting is remembered so the cluster's autoscaler
can be told about it and freed resources go to whoever waited longest.
Pure bookkeeping: the platform feeds it the cluster's shape, nothing here asks it.
"""
from __future__ import annotations

import bisect
import itertools
from collections import Counter
from typing import Callable, Iterable

from kubetune.core.feasibility import first_fit, infeasibility, short_kinds, total_of, trial_bundles
from kubetune.core.fair_share import (Line, Waiting as _Waiting, append_key, fair_keys, groups, kept_for_starting,
                                      unregistered_key)
from kubetune.core.queue_words import QueueWords
from kubetune.spec.resources import Resources

__all__ = ["Resources", "ResourceLedger", "first_fit", "total_of", "trial_bundles"]


class ResourceLedger(QueueWords):
    """Who holds what on one cluster, and who is waiting for what (in words: queue_words.py)."""

    def __init__(self, warm_passes: int = 0) -> None:
        self._total = Resources()
        self._nodes: list[Resources] = []
        self._node_types: list[Resources] | None = None
        self._growth_known = False              # the node types were read (set_capacity)
        self._growth_cause = ""                 # why they are not, if a read failed
        self._known = False                     # capacity never reported: nobody may start yet
        self._held: dict[str, list[tuple[int, Resources]]] = {}   # owner -> (node index, bundle)
        self._held_total: dict[str, Resources] = {}   # owner -> its bundles summed
        self._used: Resources | None = None     # all of _held_total summed, until it changes
        self._node_free: list[Resources] = []     # per node: capacity minus what is held there
        self._waiting: dict[str, _Waiting] = {}
        self._arrivals = itertools.count()
        self._served: Counter[str] = Counter()   # Experiment ("ns/exp/") and namespace -> grants (fair_share.py)
        self._line: Line | None = None         # the waiting queue's order and who blocks, until a change
        self._weights: dict[str, float] = {}    # namespace -> its weight in fair sharing (default 1)
        self._wakers: dict[str, Callable[[], None]] = {}   # experiment ("ns/exp/") -> wake its runner
        self._woken: str | None = None          # the owner last woken as first in line
        self._starting: set[str] = set()        # experiments that will ask soon (``starting``)
        # what placement cost (tests count it, not time), and how room is handed over (kubetune.metrics)
        self.work = dict.fromkeys(("sorts", "shape_checks", "grants", "wakes", "refused_full", "refused_turn",
                                   "passed_on"), 0)
        # how many trials in a row one trial's room may pass to within its Experiment, out of
        # turn (core/warm_room.py); 0: never. For a platform whose next trial then starts on
        # the ended one's warm worker (a pooled worker process)
        self.warm_passes = warm_passes

    # ------------------------------------------------------------ capacity

    def set_capacity(self, total: Resources, nodes: list[Resources] | None = None,
                     node_types: list[Resources] | None = None, growth_known: bool = True,
                     growth_unknown_because: str = "") -> None:
        """The cluster's shape: ``nodes`` is the full capacity of each live node (as the platform
        reports it; the ledger subtracts what it granted itself), defaulting to one node
        holding ``total``. ``node_types`` is the largest shape of each autoscaler node type,
        None when the cluster cannot grow. ``growth_known`` False: they are still being read
        (a task on a busy head can take a minute): what fits the nodes starts meanwhile, and
        nothing is called infeasible or asked of the autoscaler until they are known (queued
        words say why, if a read failed)."""
        nodes = list(nodes) if nodes else [total]
        node_types = list(node_types) if node_types is not None and growth_known else None
        unplaced = any(index < 0 for placements in self._held.values() for index, _ in placements)
        self._growth_cause = "" if growth_known else growth_unknown_because
        if not unplaced and self._known and (total, nodes, node_types, growth_known) == (
                self._total, self._nodes, self._node_types, self._growth_known):
            # the same shape (every refresh, every 2 s) and every holding on a node: the line and
            # placements stand; the first in line is woken again in case it let its turn pass
            self._woken = None
            self._wake_first()
            return
        self._total, self._nodes = total, nodes
        self._node_types, self._growth_known, self._known, self._line = node_types, growth_known, True, None
        self._node_free = list(self._nodes)
        # Nodes come and go: re-place every holding on the new node list. A holding that no
        # longer fits anywhere stays counted (index -1) until its owner releases it.
        held, self._held, self._held_total, self._used = self._held, {}, {}, None
        for owner, placements in held.items():
            self._place(owner, [bundle for _, bundle in placements], force=True)
        self._woken = None
        self._wake_first()

    def set_weights(self, weights: dict[str, float]) -> None:
        """Per-namespace weights of fair sharing (core/fair_share.py); absent: 1."""
        if weights != self._weights:
            self._weights = dict(weights)
            self._line = None

    def watch(self, experiment: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` when a request of ``experiment`` (``"ns/exp/"``) becomes first in
        line and fits: its runner should take the room now, not at its next cycle
        (everyone behind it waits for that)."""
        self._wakers[experiment] = wake

    def unwatch(self, experiment: str) -> None:
        self._wakers.pop(experiment, None)
        self._served.pop(experiment, None)     # it stopped (finished, deleted): nothing to tie-break
        self.started(experiment)

    def starting(self, experiment: str) -> None:
        """``experiment`` is being built (restored) and will ask soon: until it is ``started``
        or ``unwatch``es, those that hold some get no further trial (fair_share.kept_for_starting)."""
        self._starting.add(experiment)

    def started(self, experiment: str) -> None:
        if experiment in self._starting:
            self._starting.discard(experiment)
            self._woken = None          # the room kept for it is free now: the first in line may take it
            self._wake_first()

    def _kept_for_starting(self, owner: str, holding: set[str] | None = None) -> bool:
        return bool(self._starting) and kept_for_starting(
            groups(owner)[1], self._starting, {groups(held)[1] for held in self._held} if holding is None else holding)

    def _first_past_kept(self, owner: str, bundles: list[Resources], priority: int) -> bool:
        """While Experiments start: the first trial of one that holds nothing is not held
        up by the requests ahead of it that wait for the starters anyway."""
        holding = {groups(held)[1] for held in self._held} if self._starting else set()
        if not self._starting or groups(owner)[1] in holding:
            return False
        return all(self._kept_for_starting(other, holding) for other in self.blockers(owner, bundles, priority))

    def _wake_first(self) -> None:
        """Wake the Experiment of the first waiting request that fits, if it changed."""
        if not self._wakers or not self._waiting or not self._known:
            return
        line = self._current_line()
        first = bisect.bisect_left(line.fits_before, True) - 1   # the first place whose request fits
        if first < 0 or first >= len(line.queue):
            return
        owner = line.queue[first][0]
        if owner != self._woken:
            self._woken = owner
            wake = self._wakers.get(groups(owner)[1])
            if wake is not None:
                self.work["wakes"] += 1
                wake()

    def node_shapes(self) -> tuple[list[Resources], list[Resources] | None]:
        """The nodes there are now, and the shapes the autoscaler can add (None: it adds none)."""
        return list(self._nodes), (list(self._node_types) if self._node_types is not None else None)

    @property
    def capacity_known(self) -> bool:
        return self._known

    @property
    def growth_known(self) -> bool:
        return self._known and self._growth_known

    @property
    def total(self) -> Resources:
        return self._total

    @property
    def autoscaling(self) -> bool:     # can grow: queued demand is a scale-up request
        return self._node_types is not None

    def used(self) -> Resources:
        if self._used is None:      # asked for every queued trial's reason: summed once per change
            self._used = total_of(self._held_total.values())
        return self._used

    def free(self) -> Resources:
        return self._total - self.used()

    def _place(self, owner: str, bundles: list[Resources], force: bool = False) -> bool:
        placement = first_fit(bundles, self._node_free)
        if placement is None:
            if not force:
                return False
            placement = [-1] * len(bundles)
        for index, bundle in zip(placement, bundles):
            if index >= 0:
                self._node_free[index] = self._node_free[index] - bundle
        self._held[owner] = list(zip(placement, bundles))
        self._held_total[owner] = total_of(bundles)
        self._line = self._used = None
        return True

    def _unplace(self, owner: str) -> None:
        self._line = self._used = None
        self._held_total.pop(owner, None)
        for index, bundle in self._held.pop(owner, ()):
            if index >= 0:
                # Subtraction clamps at zero, so adding back could exceed the node: recompute
                # from the node's capacity in that (overcommitted) case.
                restored = self._node_free[index] + bundle
                self._node_free[index] = restored if restored.fits(self._nodes[index]) else self._recompute(index)

    def _recompute(self, index: int) -> Resources:
        return self._nodes[index] - total_of(b for placed in self._held.values() for node, b in placed if node == index)

    def holds(self, owner: str) -> bool:
        return owner in self._held

    def try_acquire(self, owner: str, bundles: list[Resources], priority: int = 0) -> bool:
        """Grant every bundle or none. An owner not registered with ``set_waiting`` counts
        as the newest arrival at ``priority``. On success its waiting entry is cleared."""
        if owner in self._held:
            raise ValueError(f"{owner} already holds resources; release them first")
        if self._known and first_fit(bundles, self._node_free) is None:
            # it does not fit, whoever is ahead: no line needed (nearly every call on a full cluster)
            self.work["refused_full"] += 1
            if self._line is not None:
                self._wake_first()
            return False
        if not self._known or not (self.next_owner_allowed(owner, bundles, priority)
                                   or self._first_past_kept(owner, bundles, priority)):
            self.work["refused_turn"] += self._known
            self._wake_first()     # joining the line may have put another first, which fits
            return False
        if self._kept_for_starting(owner) or not self._place(owner, bundles):
            return False
        self._waiting.pop(owner, None)
        self._line = None
        self.work["grants"] += 1
        self._served.update(groups(owner))
        shapes = {entry.shape: entry.bundles for entry in self._waiting.values()}
        if any(first_fit(bundles, self._node_free) is not None for bundles in shapes.values()):
            self._wake_first()      # else nobody to wake: the line is rebuilt when next asked
        return True

    def adopt(self, owner: str, bundles: list[Resources]) -> None:
        """Record resources already in use by a running trial (after an operator restart):
        never refuses, since the trial is running whatever the ledger thinks."""
        self._unplace(owner)
        self.clear_waiting(owner)
        self._place(owner, bundles, force=True)

    def release(self, owner: str) -> None:
        self._unplace(owner)
        self.clear_waiting(owner)
        self._wake_first()

    def may_pass_on(self, owner: str, priority: int) -> bool:
        """Whether ``owner``'s room may go to the next trial of its Experiment out of turn
        (core/warm_room.py): not while Experiments are being built (everyone's first trial
        comes first: fair_share.kept_for_starting), nor past a waiting higher priority, nor
        to an Experiment granted more trials than another that waits (they go in rounds)."""
        if not self.warm_passes or self._starting or owner not in self._held:
            return False
        if not self._waiting or not self._known:
            return True
        if self._current_line().keys[0][0] < -priority:
            return False
        experiment = groups(owner)[1]
        served = self._served.get(experiment, 0)
        return all(self._served.get(groups(other)[1], 0) >= served
                   for other in self._waiting if not other.startswith(experiment))

    def pass_on(self, holder: str, successor: str, bundles: list[Resources]) -> bool:
        """``holder``'s room, on the node(s) it is on (where its warm worker is), to
        ``successor`` asking the same ``bundles`` (or ``holder`` itself, relaunched), out of
        turn (ask ``may_pass_on`` first): a grant, counted as one in the fair line's
        tie-breaks. False if it cannot."""
        placements = self._held.get(holder)
        if placements is None or (successor != holder and successor in self._held) \
                or [b for _, b in placements] != list(bundles):
            return False
        self._held[successor] = self._held.pop(holder)
        self._held_total[successor] = self._held_total.pop(holder)
        self._line = None
        self.work["grants"] += 1
        self.work["passed_on"] += 1
        self._served.update(groups(successor))
        if self._waiting.pop(successor, None) is not None and successor == self._woken:
            self._woken = None      # it was woken for room it did not take: the next may take that
            self._wake_first()
        return True

    def feasibility(self, bundles: list[Resources]) -> str | None:
        """None if each bundle could ever be placed on some node (or autoscaler node type);
        otherwise why not, naming the resource and the largest node. Unknown capacity or node
        types: None."""
        if not self.growth_known:
            return None
        return infeasibility(bundles, self._nodes, self._node_types)

    # ------------------------------------------------------------ waiting demand

    def set_waiting(self, owner: str, bundles: list[Resources], priority: int = 0) -> None:
        """Register (or refresh) unmet demand; the arrival order is kept across refreshes."""
        current = self._waiting.get(owner)
        order = current.order if current else next(self._arrivals)
        entry = _Waiting(list(bundles), priority, order)
        if current == entry:
            return
        self._waiting[owner] = entry
        line = self._line
        key = append_key(line.fair, entry.request_of(owner)) if current is None and line is not None else None
        if key is not None and (not line.keys or key > line.keys[-1]):
            self._extend(line, owner, entry, key)      # joins the end of the line: O(1)
        else:
            self._line = None

    def clear_waiting(self, owner: str) -> None:
        if self._waiting.pop(owner, None) is not None:
            self._line = None
            if owner == self._woken:    # it gave its turn up (suspended): the next may take it
                self._woken = None
                self._wake_first()

    def is_waiting(self, owner: str) -> bool:
        return owner in self._waiting

    def _queue(self) -> list[tuple[str, _Waiting]]:
        return self._current_line().queue

    def _current_line(self) -> "Line":
        """The waiting queue in fair order (core/fair_share.py), and for each place in it
        what the requests ahead block: built once per change of the ledger (O(n log n),
        one fit check per distinct request shape), so that placing n queued trials is
        O(n log n), not O(n^2)."""
        if self._line is not None:
            return self._line
        self.work["sorts"] += 1
        keys, fair = fair_keys((entry.request_of(owner) for owner, entry in self._waiting.items()),
                               self._held_total, self._total, self._weights, self._served)
        line = Line(queue=[], keys=[], fair=fair)
        for owner in sorted(keys, key=keys.__getitem__):
            self._extend(line, owner, self._waiting[owner], keys[owner])
        self._line = line
        return line

    def _extend(self, line: "Line", owner: str, entry: _Waiting, key: tuple) -> None:
        """Append a request to the end of ``line`` (one fit check per distinct shape)."""
        shape = entry.shape
        if shape not in line.shorts:
            line.shorts[shape] = frozenset(self._short_kinds(entry.bundles))
        short = line.shorts[shape]
        position = len(line.queue)
        line.queue.append((owner, entry))
        line.keys.append(key)
        line.key_of[owner] = key
        line.fits_before.append(line.fits_before[-1] or not short)
        for kind in short:
            line.first_short.setdefault(kind, position)

    def waiting_bundles(self) -> list[Resources]:
        """Every waiting bundle, first in line first."""
        return [bundle for _, entry in self._queue() for bundle in entry.bundles]

    def autoscaler_request(self) -> list[Resources]:
        """What to pass to the platform's autoscaler request (its ``request_resources``): the
        autoscaler sizes the cluster to hold these bundles regardless of current use, so
        the request is everything held plus everything waiting, not the waiting part alone."""
        held = [bundle for placements in self._held.values() for _, bundle in placements]
        return held + self.waiting_bundles()

    def _short_kinds(self, bundles: list[Resources]) -> set[str]:
        """The resources a request is blocked on right now (empty if it would fit)."""
        self.work["shape_checks"] += 1
        return short_kinds(bundles, self._node_free, self.free)

    def blockers(self, owner: str, bundles: list[Resources] | None = None, priority: int = 0) -> list[str]:
        """Owners ahead in line that ``owner`` must not overtake.

        Ahead means higher priority, or equal priority and waiting longer. Someone ahead
        blocks if its request fits right now (it should get the resources), or if it is
        short of a resource this owner also asks for (taking it would starve the one
        ahead). Requests that need other resources may start meanwhile (backfill).
        """
        bundles, key = self._place_in_line(owner, bundles, priority)
        kinds = {k for b in bundles or [] for k in b.kinds()}
        line = self._current_line()
        result = []
        for (other, entry), other_key in zip(line.queue, line.keys):
            if other == owner or other_key >= key:
                continue
            short = line.shorts[entry.shape]     # what it is short of: per shape, made with the line
            if not short or short & kinds:
                result.append(other)
        return result

    def _place_in_line(self, owner: str, bundles: list[Resources] | None,
                       priority: int) -> tuple[list[Resources] | None, tuple]:
        """What ``owner`` asks for and its key in the line (last of its priority if it never waited)."""
        mine = self._waiting.get(owner)
        if mine is None:
            return bundles, unregistered_key(priority)
        return mine.bundles, self._current_line().key_of[owner]

    def next_owner_allowed(self, owner: str, bundles: list[Resources] | None = None, priority: int = 0) -> bool:
        """``not blockers(...)`` in O(log n): a binary search for the owner's place in line,
        then what the requests ahead of it block (``_current_line``)."""
        bundles, key = self._place_in_line(owner, bundles, priority)
        line = self._current_line()
        position = bisect.bisect_left(line.keys, key)     # requests strictly ahead
        if line.fits_before[position]:
            return False
        kinds = {k for b in bundles or [] for k in b.kinds()}
        return all(line.first_short.get(kind, position) >= position for kind in kinds)
