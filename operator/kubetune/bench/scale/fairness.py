"""How fairly the capacity was shared (pure: no clock, no I/O).

An Experiment *has work waiting* from its apply until its last trial starts.  While
it does it asks for ``parallelism`` slots; otherwise for the trials it still runs.
At every moment the slots in use are split max-min fairly (water-filling: nobody
gets more than it asks, the rest is shared equally) first between namespaces, then
between the Experiments of each namespace; that is the Experiment's *fair share*.  Its *share* is the trial-seconds it ran over the
window when it had work waiting, divided by the fair share's trial-seconds over the
same window: 1.0 is fair, 0.0 is starved.  A namespace's share is the sum over its
Experiments (so with equal Experiments per namespace, namespaces are compared too).

``starvation`` is the timing-free view the integration test asserts on: per
Experiment, the most trial completions of *other* Experiments seen in a row while it
had work waiting, ran fewer trials than its parallelism, and started none."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from kubetune.bench.scale.shapes import Planned
from kubetune.controller.conditions import parse_rfc3339


@dataclass(frozen=True)
class Runs:
    key: str                                   # "<namespace>/<experiment>"
    group: str                                 # its namespace
    applied: float
    parallelism: int
    trials: tuple[tuple[float, float], ...]    # (start, end) of each trial that ran

    @property
    def waiting_until(self) -> float:
        """When its last trial started: it had work waiting before."""
        return max((start for start, _ in self.trials), default=self.applied)


def runs_of(planned: Iterable[Planned], trials_by_key: Mapping[str, list[dict]],
            applied: Mapping[str, float]) -> list[Runs]:
    """Each applied Experiment's trials as (start, end) from their status: the host
    clocks of the trials themselves, which an operator restart does not move."""
    runs = []
    for p in planned:
        spans = []
        for trial in trials_by_key.get(p.key, []):
            status = trial.get("status") or {}
            if status.get("startTime") and status.get("completionTime"):
                spans.append((parse_rfc3339(status["startTime"]), parse_rfc3339(status["completionTime"])))
        if p.key in applied:
            runs.append(Runs(p.key, p.namespace, applied[p.key], p.parallelism, tuple(spans)))
    return runs


def water_fill(capacity: float, demands: Mapping[str, float]) -> dict[str, float]:
    """Max-min fair split of ``capacity`` among ``demands``."""
    shares: dict[str, float] = {}
    left, pending = capacity, sorted(demands.items(), key=lambda kv: kv[1])
    while pending:
        level = left / len(pending)
        key, demand = pending[0]
        if demand <= level:
            shares[key] = demand
            left -= demand
            pending.pop(0)
        else:
            for key, _ in pending:
                shares[key] = level
            break
    return shares


def fair_split(capacity: float, demands: Mapping[str, float], groups: Mapping[str, str]) -> dict[str, float]:
    """Max-min fair between namespaces (each asking what its Experiments ask), then
    between the Experiments of each namespace: the operator's policy with equal
    weights (docs/explanation/fair-sharing.md)."""
    asked: dict[str, float] = {}
    for key, demand in demands.items():
        asked[groups[key]] = asked.get(groups[key], 0.0) + demand
    per_group = water_fill(capacity, asked)
    shares: dict[str, float] = {}
    for group, amount in per_group.items():
        shares.update(water_fill(amount, {k: d for k, d in demands.items() if groups[k] == group}))
    return shares


@dataclass
class Shares:
    run_s: dict[str, float] = field(default_factory=dict)      # trial-seconds run while it had work waiting
    fair_s: dict[str, float] = field(default_factory=dict)     # its fair share of them
    total_run_s: dict[str, float] = field(default_factory=dict)   # trial-seconds over the whole run

    def share(self, key: str) -> float | None:
        fair = self.fair_s.get(key, 0.0)
        return self.run_s.get(key, 0.0) / fair if fair > 0 else None


def shares(experiments: Sequence[Runs]) -> Shares:
    """Sweep over every apply, start and end: between two such moments nothing changes."""
    events: list[tuple[float, int, str]] = []       # (time, +1 start / -1 end / 0 other, key)
    for e in experiments:
        events.append((e.applied, 0, e.key))
        events.append((e.waiting_until, 0, e.key))
        for start, end in e.trials:
            events.append((start, 1, e.key))
            events.append((max(end, start), -1, e.key))
    events.sort()
    by_key = {e.key: e for e in experiments}
    running = {e.key: 0 for e in experiments}
    result = Shares(run_s={k: 0.0 for k in by_key}, fair_s={k: 0.0 for k in by_key},
                    total_run_s={k: 0.0 for k in by_key})
    busy: set[str] = set()           # running a trial or having work waiting
    previous = events[0][0] if events else 0.0
    for moment, change, key in events:
        span = moment - previous
        if span > 0 and busy:
            waiting = {k for k in busy if by_key[k].applied <= previous < by_key[k].waiting_until}
            demands = {k: float(by_key[k].parallelism if k in waiting else running[k]) for k in busy}
            fair = fair_split(float(sum(running.values())), demands, {k: by_key[k].group for k in busy})
            for k in busy:
                result.total_run_s[k] += running[k] * span
                if k in waiting:
                    result.run_s[k] += running[k] * span
                    result.fair_s[k] += fair[k] * span
        previous = moment
        running[key] += change
        e = by_key[key]
        if running[key] > 0 or e.applied <= moment < e.waiting_until:
            busy.add(key)
        else:
            busy.discard(key)
    return result


def summarize(experiments: Sequence[Runs], computed: Shares) -> dict[str, Any]:
    per_experiment = {e.key: computed.share(e.key) for e in experiments}
    known = {k: v for k, v in per_experiment.items() if v is not None}
    groups: dict[str, list[str]] = {}
    for e in experiments:
        groups.setdefault(e.group, []).append(e.key)
    total = sum(computed.total_run_s.values()) or 1.0
    per_group = {}
    for group, keys in sorted(groups.items()):
        fair = sum(computed.fair_s[k] for k in keys)
        per_group[group] = {"share": sum(computed.run_s[k] for k in keys) / fair if fair > 0 else None,
                            "fraction_of_trial_seconds": sum(computed.total_run_s[k] for k in keys) / total}
    slowest = min(known, key=known.get) if known else None
    ordered = sorted(known.values())
    return {
        "slowest_experiment": slowest,
        "slowest_share": known.get(slowest) if slowest else None,
        "share_p10": ordered[len(ordered) // 10] if ordered else None,
        "share_median": ordered[len(ordered) // 2] if ordered else None,
        "share_max": ordered[-1] if ordered else None,
        "experiments": per_experiment,
        "namespaces": per_group,
        "slowest_namespace_share": min((g["share"] for g in per_group.values() if g["share"] is not None),
                                       default=None),
    }


@dataclass(frozen=True)
class Streak:
    """An Experiment's longest deprivation: ``completions`` of other Experiments' trials
    in a row, the first of them at ``since`` and the last at ``until`` (trial clocks)."""
    completions: int = 0
    since: float = 0.0
    until: float = 0.0


def starvation(experiments: Iterable[Runs]) -> dict[str, int]:
    """Per Experiment, the longest run of other Experiments' trial completions it saw
    while deprived (work waiting, fewer trials running than its parallelism, none
    started in between).  Ordered by the trials' own start and end times: no duration
    enters, only the order of events."""
    return {key: streak.completions for key, streak in starvation_streaks(experiments).items()}


def starvation_streaks(experiments: Iterable[Runs]) -> dict[str, Streak]:
    """``starvation`` with when each longest streak happened (to tell, say, a restart's
    restore order from a steady unfairness)."""
    experiments = list(experiments)
    events: list[tuple[float, int, str]] = []       # ends (0) before starts (1) at the same moment
    for e in experiments:
        for start, end in e.trials:
            heapq.heappush(events, (start, 1, e.key))
            heapq.heappush(events, (max(end, start), 0, e.key))
    by_key = {e.key: e for e in experiments}
    started = {k: 0 for k in by_key}
    running = {k: 0 for k in by_key}
    streak = {k: Streak() for k in by_key}
    longest = {k: Streak() for k in by_key}
    while events:
        moment, kind, key = heapq.heappop(events)
        if kind == 1:
            started[key] += 1
            running[key] += 1
            streak[key] = Streak()
            continue
        running[key] -= 1
        for k, e in by_key.items():
            deprived = (k != key and e.applied <= moment and started[k] < len(e.trials)
                        and running[k] < e.parallelism)
            if deprived:
                now = streak[k]
                streak[k] = Streak(now.completions + 1, now.since if now.completions else moment, moment)
                if streak[k].completions > longest[k].completions:
                    longest[k] = streak[k]
    return longest
