"""Why a trial waits, in words for the Trial and Experiment status: the ledger's
(core/resources.py) queue as a user reads it.  A mixin of ``ResourceLedger``, over its
bookkeeping; it changes nothing."""
from __future__ import annotations

from kubetune.core.feasibility import (kind_order as _kind_order, total_of, waiting_for_growth,
                                      waiting_for_one_node, waiting_for_room)


class QueueWords:
    """``queue_reason`` and ``queue_summary`` of ``ResourceLedger``."""

    def queue_reason(self, owner: str) -> str:
        """Why ``owner`` is not running yet, in words for the Trial and Experiment status:
        what it waits for and behind what, never a figure that moves with each grant or
        release (each change is a status write of every queued Trial: core/feasibility.py)."""
        entry = self._waiting.get(owner)
        if entry is None:
            return ""
        if not self._known:
            return "waiting for the cluster's capacity to be known"
        suffix = "; scale-up requested" if self.autoscaling else ""
        if self._growth_cause:
            suffix += f"; the autoscaler's node types are unknown: {self._growth_cause}"
        demand = total_of(entry.bundles)
        short = self._short_kinds(entry.bundles)
        if short:
            kind = min(short, key=_kind_order)
            if demand.amount(kind) <= self.free().amount(kind) + 1e-9:
                return waiting_for_one_node(kind, max(b.amount(kind) for b in entry.bundles),
                                            len(self._nodes)) + suffix
            if demand.amount(kind) > self._total.amount(kind) + 1e-9:
                return waiting_for_growth(kind, demand.amount(kind), self._total.amount(kind)) + suffix
            return waiting_for_room(kind, demand.amount(kind), self._total.amount(kind)) + suffix
        if not self.next_owner_allowed(owner) or self._kept_for_starting(owner):
            # it would fit, but the room goes to someone ahead: the words of a full cluster,
            # which it is again once that one took it
            kind = min(demand.kinds() or ["CPU"], key=_kind_order)
            return waiting_for_room(kind, demand.amount(kind), self._total.amount(kind)) + suffix
        return "resources are free; starting at the next step"

    def queue_summary(self, owners: list[str]) -> str:
        """What the Experiment's queued trials ``owners`` (all asking for the same) wait
        for: the words of the first in line. How many wait is in the Experiment's counts."""
        waiting = [(owner, self._waiting[owner]) for owner in owners if owner in self._waiting]
        if not waiting:
            return ""
        key_of = self._current_line().key_of if self._known else {}
        first, _ = min(waiting, key=lambda item: key_of.get(item[0], (-item[1].priority, item[1].order)))
        return self.queue_reason(first)
