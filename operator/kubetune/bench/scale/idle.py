"""Room left idle while trials wait (issue 26): the operator's own /metrics page, read
about once a second while the run goes on.  Each reading says how much of the cluster
the ledger has free (``kubetune_cluster_free``) and how many bundles wait
(``kubetune_queued_bundles``); between two readings, the slots free *and* wanted
(``min(free slots, queued)``) count as idle slot-seconds.  It is the direct measure of
"capacity sat idle while the queue waited": the ledger handing freed room over one
request at a time shows as a large fraction here, whatever else is slow.  The ledger's
own counters (``kubetune_ledger_events``: grants, wakes, refusals by cause) are read at
the end.  Parsing and arithmetic are pure; ``Sampler.read`` does the one HTTP GET."""
from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

GAP_S = 3.0     # readings further apart (the operator restarting, a slow page) are not integrated


def parse(text: str) -> tuple[float | None, float | None, dict[str, float]]:
    """(free CPU, queued bundles, ledger event counters) from a /metrics page."""
    free = queued = None
    events: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("kubetune_cluster_free{") and 'resource="CPU"' in line:
            free = (free or 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("kubetune_queued_bundles "):
            queued = float(line.rsplit(" ", 1)[1])
        elif line.startswith("kubetune_ledger_events_total{"):
            name = line.split('event="', 1)[1].split('"', 1)[0]
            events[name] = events.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return free, queued, events


@dataclass
class Sampler:
    """Readings of one operator's page; ``figures`` sums them over the run."""
    port: int
    cpu_per_trial: float
    slots: int
    samples: list[tuple[float, float, float]] = field(default_factory=list)   # (time, free CPU, queued)
    events: dict[str, float] = field(default_factory=dict)     # the last counters seen (per operator process)
    events_before_restart: dict[str, float] = field(default_factory=dict)
    _last: float = 0.0

    def read(self, every_s: float = 1.0) -> None:
        if time.monotonic() - self._last < every_s:
            return
        self._last = time.monotonic()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return
        free, queued, events = parse(text)
        if free is not None and queued is not None:
            self.samples.append((time.time(), free, queued))
        if events:
            self.events = events

    def restarted(self) -> None:
        """The operator was killed: its counters start again from zero."""
        for name, value in self.events.items():
            self.events_before_restart[name] = self.events_before_restart.get(name, 0.0) + value
        self.events = {}

    def figures(self) -> dict[str, Any]:
        return summarize(self.samples, self.cpu_per_trial, self.slots,
                         {k: self.events_before_restart.get(k, 0.0) + self.events.get(k, 0.0)
                          for k in set(self.events) | set(self.events_before_restart)})


def summarize(samples: list[tuple[float, float, float]], cpu_per_trial: float, slots: int,
              events: dict[str, float]) -> dict[str, Any]:
    idle = wanted = observed = 0.0
    for (t0, free, queued), (t1, _, _) in zip(samples, samples[1:]):
        dt = t1 - t0
        if dt <= 0 or dt > GAP_S:
            continue
        observed += dt
        free_slots = int(free / cpu_per_trial + 1e-6)
        idle += dt * min(free_slots, queued)
        wanted += dt * (queued > 0)
    capacity = observed * slots
    return {"observed_s": round(observed, 1), "seconds_with_trials_queued": round(wanted, 1),
            "idle_slot_s_while_queued": round(idle, 1),
            "idle_fraction_of_capacity": round(idle / capacity, 4) if capacity else None,
            "readings": len(samples), "ledger_events": {k: int(v) for k, v in sorted(events.items())}}
