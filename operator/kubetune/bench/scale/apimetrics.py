"""What the API server says about the load: ``/metrics`` read before and after a run.

- ``apiserver_request_total`` by resource and verb;
- ``apiserver_request_duration_seconds`` (a histogram) by verb, WATCH left out (a watch
  lasts as long as it is open), as quantiles the way Prometheus' ``histogram_quantile``
  estimates them;
- the storage size (``apiserver_storage_size_bytes``, formerly
  ``apiserver_storage_db_total_size_in_bytes``).
The apiserver's metrics carry no user agent: requests of the benchmark itself are
counted by the benchmark (``observe.Observer.own_requests``) and subtracted."""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Mapping

COUNTED_RESOURCES = frozenset({"experiments", "trials", "events"})
STORAGE_METRICS = ("apiserver_storage_size_bytes", "apiserver_storage_db_total_size_in_bytes")


@dataclass
class Snapshot:
    requests: dict[str, float] = field(default_factory=dict)           # "<resource>[/<sub>] <VERB>" -> count
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)   # verb -> le -> cumulative count
    seconds: dict[str, float] = field(default_factory=dict)            # verb -> sum of durations
    storage_bytes: float | None = None


def parse(text: str) -> Snapshot:
    from prometheus_client.parser import text_string_to_metric_families
    snap = Snapshot()
    requests: dict[str, float] = collections.defaultdict(float)
    buckets: dict[str, dict[float, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    seconds: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in STORAGE_METRICS:
                snap.storage_bytes = max(snap.storage_bytes or 0.0, sample.value)
                continue
            if labels.get("resource") not in COUNTED_RESOURCES:
                continue
            verb = labels.get("verb", "")
            if sample.name == "apiserver_request_total":
                resource = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
                requests[f"{resource} {verb}"] += sample.value
            elif verb != "WATCH" and sample.name == "apiserver_request_duration_seconds_bucket":
                buckets[verb][float(labels["le"])] += sample.value
            elif verb != "WATCH" and sample.name == "apiserver_request_duration_seconds_sum":
                seconds[verb] += sample.value
    snap.requests = dict(requests)
    snap.buckets = {verb: dict(b) for verb, b in buckets.items()}
    snap.seconds = dict(seconds)
    return snap


def delta(before: Snapshot, after: Snapshot) -> Snapshot:
    def minus(a: Mapping, b: Mapping) -> dict:
        return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}
    return Snapshot(
        requests={k: v for k, v in sorted(minus(after.requests, before.requests).items()) if v},
        buckets={verb: minus(after.buckets.get(verb, {}), before.buckets.get(verb, {})) for verb in after.buckets},
        seconds=minus(after.seconds, before.seconds), storage_bytes=after.storage_bytes)


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """As ``histogram_quantile``: linear within the bucket the rank falls in."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in ordered:
        if cumulative >= rank:
            if math.isinf(bound):
                return lower_bound
            inside = cumulative - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / inside if inside else 1.0)
        lower_bound, lower_count = bound, cumulative
    return lower_bound


def latency(snap: Snapshot) -> dict[str, dict[str, float | None]]:
    """Per verb: requests, mean, p50, p95, p99 (seconds)."""
    table = {}
    for verb, buckets in sorted(snap.buckets.items()):
        count = max(buckets.values(), default=0.0)
        if count <= 0:
            continue
        table[verb] = {"requests": count, "mean_s": snap.seconds.get(verb, 0.0) / count,
                       "p50_s": quantile(buckets, 0.5), "p95_s": quantile(buckets, 0.95),
                       "p99_s": quantile(buckets, 0.99)}
    return table


def by_verb(requests: Mapping[str, float]) -> dict[str, float]:
    verbs: dict[str, float] = collections.defaultdict(float)
    for key, value in requests.items():
        verbs[key.rsplit(" ", 1)[1]] += value
    return dict(sorted(verbs.items()))


def minus_own(requests: Mapping[str, float], own: Mapping[str, float]) -> dict[str, float]:
    """The apiserver's counts less the benchmark's own requests (never below zero)."""
    return {k: max(0.0, v - own.get(k, 0.0)) for k, v in requests.items() if v - own.get(k, 0.0) > 0}
