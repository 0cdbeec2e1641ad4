"""The admission window: how many trials the runner hands to a platform that admits
them through a queue of its own (``spec.queue``; the pod platform's), and the reasons a trial waiting in such a queue shows.  Pure.

A trial handed over is running to the runner (it holds its place) but waits for the
platform's admission; ``parallelism`` bounds the admitted trials and
``spec.budget.admissionWindow`` the waiting ones."""
from __future__ import annotations

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
