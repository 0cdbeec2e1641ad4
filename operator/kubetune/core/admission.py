"""The admission window: how many trials the runner hands to a platform that admits
them through a queue of its own (``spec.queue``; the pod platform's), and the reasons a trial waiting in such a queue shows.  Pure.

A trial handed over is running to the runner (it holds its place) but waits for the
platform's admission; ``parallelism`` bounds the admitted trials and
``spec.budget.admissionWindow`` the waiting ones."""
from __future__ import annotations

from typing import Any, Iterable

QUEUED = "WaitingForAdmission"
PROVISIONING = "Provisioning"
PREEMPTED = "Preempted"
EVICTED = "Evicted"
BEYOND_PARALLELISM = "AdmittedBeyondParallelism"   # an admission the runner gave back (a pause)


def may_hand_over(admitted: int, waiting: int, parallelism: int, window: int, queue_full: bool) -> bool:
    """Whether the runner may hand one more trial to the platform's queue (launch it).

    ``parallelism`` bounds the admitted trials, ``window`` the ones waiting for admission;
    a waiting trial does not hold a parallelism slot.  While the platform admits what it
    is given (no waiting trial found the queue full) only ``parallelism - admitted`` are handed
    over, as without a queue: more would be admitted at once, beyond parallelism, and be
    given back.  Once the platform says the queue is full, up to ``window`` wait beyond
    the admitted ones and keep their place in the queue; should several be admitted at once
    (quota freed), those beyond parallelism are given back (``on_admission``)."""
    if admitted >= parallelism or waiting >= window:
        return False
    return queue_full or admitted + waiting < parallelism


def in_flight_limit(parallelism: int, window: int, queue_full: bool) -> int:
    """How many unfinished trials may exist: the admitted ones and the waiting ones."""
    return parallelism + window if queue_full else parallelism


class AdmissionWindow:
    """The runner's trials handed to the platform's queue and not admitted yet: RUNNING
    to the runner (the platform watches them) but holding no parallelism slot; at most
    ``spec.budget.admissionWindow`` of them (``may_hand_over``)."""

    def __init__(self) -> None:
        self.awaiting: set[str] = set()
        # of those, the ones the queue found no room for at the last poll: the queue is full
        self._queue_full: set[str] = set()
        # after a restart: running trials whose admission is not known yet (counted in the
        # window until the first poll says; an admission seen then was counted before)
        self._unknown: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.awaiting

    def __len__(self) -> int:
        return len(self.awaiting)

    def hand_over(self, name: str, *, restored: bool = False) -> None:
        """``name`` now waits for admission (launched, or running before a restart)."""
        self.awaiting.add(name)
        if restored:
            self._unknown.add(name)

    def forget(self, name: str) -> None:
        """``name`` is no longer running: it waits for nothing."""
        self.awaiting.discard(name)
        self._unknown.discard(name)
        self._queue_full.discard(name)

    def still_waiting(self, name: str, queue_full: bool) -> None:
        self.awaiting.add(name)
        self._unknown.discard(name)
        if queue_full:
            self._queue_full.add(name)
        else:
            self._queue_full.discard(name)

    def admit(self, name: str, running: int) -> tuple[int, bool] | None:
        """``name`` was admitted: how many trials were admitted before it (of ``running``),
        and whether it was admitted while no operator watched (after a restart); None when
        it was not waiting."""
        if name not in self.awaiting:
            return None
        self._queue_full.discard(name)
        # trials confirmed admitted: after a restart, only those seen admitted since (all
        # restored running trials start out awaiting), so at most parallelism pass
        admitted_before = running - len(self.awaiting)
        self.awaiting.discard(name)
        restored = name in self._unknown
        self._unknown.discard(name)
        return admitted_before, restored

    def slot_free(self, running: int, parallelism: int, window: int) -> bool:
        waiting = len(self.awaiting)
        return may_hand_over(running - waiting, waiting, parallelism, window, bool(self._queue_full))

    def in_flight_limit(self, parallelism: int, window: int) -> int:
        return in_flight_limit(parallelism, window, bool(self._queue_full))

    def summary(self, queue: bool, trials: Iterable[Any]) -> dict[str, Any] | None:
        """Admissions, queue wait and evictions over every trial (a fixed-size summary of
        the Experiment's status); None if the Experiment has no queue and never waited."""
        trials = list(trials)
        admissions = sum(t.queue_waits for t in trials)
        evictions = sum(t.evictions for t in trials)
        if not (queue or admissions or evictions or self.awaiting):
            return None
        total = sum(t.queue_wait_s for t in trials)
        longest = max((t.queue_wait_s for t in trials), default=0.0)   # one trial's, all its attempts
        return {"admissions": admissions, "waitingForAdmission": len(self.awaiting),
                "evictions": evictions,
                "queueWaitSeconds": {"total": round(total, 3), "mean": round(total / admissions, 3) if admissions else 0.0,
                                     "max": round(longest, 3)}}
