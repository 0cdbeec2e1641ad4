"""What a scheduler expects its trials to run, before the run: ``kubetune plan``'s
iteration arithmetic (core/plan.py).  Each scheduler says its own through
``TrialScheduler.planned``; this module has the vocabulary and the successive-halving
arithmetic that asha, hyperband and MO-ASHA share.  Pure."""
from __future__ import annotations

import bisect
import heapq
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Rung:
    iteration: int           # trials are judged (or perturbed) at this iteration
    expected: float          # trials expected to reach it
    most: int                # trials that can reach it (nothing stopped before)
    bracket: int = 0         # hyperband: the bracket; 0 otherwise


@dataclass(frozen=True)
class Planned:
    """Iterations the trials of an Experiment run: all of them at worst, and expected."""
    worst_iterations: float
    expected_iterations: float
    rungs: tuple[Rung, ...]
    notes: tuple[str, ...] = ()


def successive_halving(brackets: list[int], grace_period: int, reduction_factor: int, max_iterations: int,
                       parallelism: int, repetitions: int = 16) -> tuple[float, list[Rung]]:
    """Expected iterations of asynchronous successive halving, and its rungs, for trials
    whose brackets are ``brackets`` (one entry per trial, in creation order; ASHA: all 0).

    Arrival order matters, so it is played out rather than summed: ``parallelism`` slots
    take the trials in order; a trial of bracket b is judged at gracePeriod x rf^(b+k)
    iterations by Optuna's rule (``_is_trial_promotable_to_next_rung``: it continues when
    it is in the top max(n // rf, 1) of the n trials that reached that rung, itself
    included) and ends at its first failed rung or at maxIterations.  A trial that
    continues early (the first at a rung always does) reaches the next rung early, so
    later rungs see the better trials late: averaging a closed-form random-order sum
    misses a third of the cost.  Qualities are random (seeded: the plan is the same every
    time), averaged over ``repetitions`` draws."""
    rng = random.Random(0)
    counts: dict[tuple[int, int], float] = {}
    total = 0.0
    for _ in range(repetitions):
        total += _play(brackets, grace_period, reduction_factor, max_iterations, parallelism, rng, counts)
    rungs = [Rung(iteration, reached / repetitions, brackets.count(bracket), bracket)
             for (bracket, iteration), reached in sorted(counts.items())]
    return total / repetitions, rungs


def _play(brackets: list[int], grace: int, rf: int, top: int, parallelism: int, rng: random.Random,
          counts: dict[tuple[int, int], float]) -> float:
    """One run with random qualities (lower is better); adds rung arrivals to ``counts``."""
    quality = [rng.random() for _ in brackets]
    at_rung: dict[tuple[int, int], list[float]] = {}      # (bracket, milestone) -> sorted qualities
    events: list[tuple[float, int, int]] = []             # (time, trial, milestone it reaches then)
    waiting = iter(range(len(brackets)))
    iterations = 0.0

    def start(now: float) -> None:
        trial = next(waiting, None)
        if trial is not None:
            first = grace * rf ** brackets[trial]
            heapq.heappush(events, (now + min(first, top), trial, min(first, top)))

    for _ in range(min(parallelism, len(brackets))):
        start(0.0)
    while events:
        now, trial, milestone = heapq.heappop(events)
        key = (brackets[trial], milestone)
        counts[key] = counts.get(key, 0.0) + 1
        if milestone >= top:
            iterations += top
            start(now)
            continue
        reached = at_rung.setdefault(key, [])
        bisect.insort(reached, quality[trial])
        if quality[trial] <= reached[max(len(reached) // rf, 1) - 1]:
            following = min(milestone * rf, top)
            heapq.heappush(events, (now + following - milestone, trial, following))
        else:
            iterations += milestone
            start(now)
    return iterations
