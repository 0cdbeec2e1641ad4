"""Prometheus metrics of the operator (``kubetune operator --metrics-port``).

Counters are incremented where things happen (controller, store); the gauges —
Experiments and Trials by phase, queued demand, Ray connectivity — are computed at
scrape time from the operator's state (``OperatorState``), so they cannot drift
from what the status subresources say.

The HTTP endpoint runs on the operator's asyncio loop (aiohttp, which kopf already
uses), the same thread that mutates that state: a scrape never sees a half-updated
runner, and an unresponsive loop shows up as an unresponsive /metrics.

Names follow the Prometheus conventions (``kubetune_`` prefix, ``_total`` for
counters); label values come from small fixed sets (phases, resource kinds,
reasons), never from Trial names.  The usage counters (``kubetune_gpu_seconds_total``
and friends) are the one exception, labelled by namespace and Experiment: chargeback
needs them per Experiment, and an Experiment is a series, not a result.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

EXPERIMENT_PHASES = ("Pending", "Running", "Suspended", "Succeeded", "Failed")
TRIAL_PHASES = ("pending", "queued", "running", "paused", "succeeded", "failed", "stopped")

RESULTS_PROCESSED = Counter(
    "kubetune_results_processed_total", "Trial results (kubetune.report calls) the operator recorded",
    registry=REGISTRY)
API_WRITES = Counter(
    "kubetune_api_writes_total", "Writes to the Kubernetes API by the controller",
    ["resource", "verb"], registry=REGISTRY)
API_WRITE_BYTES = Counter(
    "kubetune_api_write_bytes_total", "Bytes of JSON the controller sent in its writes to the Kubernetes API",
    ["resource", "verb"], registry=REGISTRY)
STATUS_WRITE_FAILURES = Counter(
    "kubetune_status_write_failures_total", "Writes the API server refused (retried with backoff)",
    ["resource", "reason"], registry=REGISTRY)
EVENTS = Counter(
    "kubetune_events_total", "Kubernetes Events posted on Experiments and Trials (a repeat counted on the "
    "Event already posted is one more)", ["type", "reason"], registry=REGISTRY)
EVENTS_DROPPED = Counter(
    "kubetune_events_dropped_total", "Kubernetes Events dropped because too many waited to be posted "
    "(k8s/events.py)", ["type", "reason"], registry=REGISTRY)
RECONCILE_ERRORS = Counter(
    "kubetune_reconcile_errors_total",
    "Reconcile cycles that ended in an error (the loop retries; reason: exception class or RayUnavailable)",
    ["reason"], registry=REGISTRY)

for _resource, _verb in (("trials", "create"), ("trials", "patch_status"), ("experiments", "patch_status")):
    API_WRITES.labels(_resource, _verb)   # present (at 0) from the first scrape: rate() needs a start
    API_WRITE_BYTES.labels(_resource, _verb)


def api_write(resource: str, verb: str, size: int = 0) -> None:
    API_WRITES.labels(resource, verb).inc()
    API_WRITE_BYTES.labels(resource, verb).inc(size)


def status_write_failed(resource: str, reason: str) -> None:
    STATUS_WRITE_FAILURES.labels(resource, reason or "Unknown").inc()


def event_posted(kind: str, reason: str) -> None:
    EVENTS.labels(kind, reason or "Unknown").inc()


def event_dropped(kind: str, reason: str) -> None:
    EVENTS_DROPPED.labels(kind, reason or "Unknown").inc()


def results_processed(count: int) -> None:
    if count:
        RESULTS_PROCESSED.inc(count)


USAGE_SECONDS = {
    key: Counter(f"kubetune_{name}_seconds_total", help_text, ["namespace", "experiment"], registry=REGISTRY)
    for key, name, help_text in (
        ("gpuSeconds", "gpu", "GPU-seconds trials used (run time on the trial hosts' clocks x GPUs), every attempt"),
        ("cpuSeconds", "cpu", "CPU-seconds trials used (run time x CPUs), every attempt"),
        ("runSeconds", "run", "Seconds trials ran, every attempt"),
        ("queueSeconds", "queue", "Seconds trials waited to run: Queued, Kueue admission, the autoscaler"))}


def usage_counted(namespace: str, experiment: str, deltas: dict[str, float]) -> None:
    for key, delta in deltas.items():
        if delta > 0 and key in USAGE_SECONDS:
            USAGE_SECONDS[key].labels(namespace, experiment).inc(delta)


def reconcile_error(reason: str) -> None:
    RECONCILE_ERRORS.labels(reason).inc()


class StateCollector(Collector):
    """Gauges computed from ``OperatorState`` at scrape time (``state()`` may be None
    before the operator's startup handler ran)."""

    def __init__(self, state: Callable[[], Any]) -> None:
        self._state = state

    def describe(self) -> Iterable:
        return []   # unchecked collector: the metric families are built in collect()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state()
        # a finished Experiment at rest has no controller, only its counts (OperatorState.serve)
        statuses = ([c.written_status or {} for c in state.controllers.values()]
                    + list(getattr(state, "resting", {}).values())) if state is not None else []
        handles = state.registry.platforms() if state is not None else []

        experiments = GaugeMetricFamily(
            "kubetune_experiments", "Experiments served by this operator, by phase", labels=["phase"])
        trials = GaugeMetricFamily(
            "kubetune_trials", "Trials of the served Experiments, by phase", labels=["phase"])
        by_phase = dict.fromkeys(EXPERIMENT_PHASES, 0)
        trial_counts = dict.fromkeys(TRIAL_PHASES, 0)
        for status in statuses:
            phase = status.get("phase") or "Pending"
            by_phase[phase] = by_phase.get(phase, 0) + 1
            for key, value in (status.get("trialCounts") or {}).items():
                if key in trial_counts:
                    trial_counts[key] += int(value or 0)
        for phase, count in by_phase.items():
            experiments.add_metric([phase], count)
        for phase, count in trial_counts.items():
            trials.add_metric([phase], count)
        yield experiments
        yield trials

        demand = GaugeMetricFamily(
            "kubetune_queued_demand",
            "Resources asked for by queued trials (what the autoscaler is asked to add), by resource",
            labels=["resource"])
        waiting = GaugeMetricFamily(
            "kubetune_queued_bundles", "Resource bundles of queued trials waiting for room")
        totals: dict[str, float] = {"CPU": 0.0, "GPU": 0.0}
        bundles = 0
        for handle in handles:
            for bundle in handle.ledger.waiting_bundles():
                bundles += 1
                for kind, amount in bundle.to_ray().items():
                    totals[kind] = totals.get(kind, 0.0) + amount
        for kind, amount in sorted(totals.items()):
            demand.add_metric([kind], amount)
        waiting.add_metric([], bundles)
        yield demand
        yield waiting

        yield from _results_writer_metrics(getattr(state, "results", None))

        up = GaugeMetricFamily("kubetune_ray_connected", "1 while the Ray cluster answers, else 0",
                               labels=["address"])
        # the live figures a queued Trial's message leaves out (core/feasibility.py): its
        # status is written when what it waits for changes, not at every grant or release
        capacity = GaugeMetricFamily("kubetune_cluster_capacity",
                                     "Resources of the cluster's nodes as the operator's ledger knows them",
                                     labels=["address", "resource"])
        free = GaugeMetricFamily("kubetune_cluster_free",
                                 "Resources of the cluster not held by this operator's trials",
                                 labels=["address", "resource"])
        for handle in handles:
            if not handle.retired:   # ended for want of use: nobody waits for it
                up.add_metric([handle.address], 1.0 if handle.connected else 0.0)
                if handle.ledger.capacity_known:
                    for kind, amount in sorted(handle.ledger.total.to_ray().items()):
                        capacity.add_metric([handle.address, kind], amount)
                        free.add_metric([handle.address, kind], handle.ledger.free().amount(kind))
        yield up
        yield capacity
        yield free
        # how freed room is handed over (issue 26): grants against wakes and refusals by cause
        events = CounterMetricFamily("kubetune_ledger_events",
                                     "What the resource ledgers did: grants (passed_on: of those, an ended trial's "
                                     "room to its Experiment's next trial), wakes of an Experiment whose trial "
                                     "may start, refusals by cause, rebuilds of the waiting line", labels=["event"])
        counted: dict[str, int] = {}
        for handle in handles:
            for name, count in handle.ledger.work.items():
                counted[name] = counted.get(name, 0) + count
        for name, count in sorted(counted.items()):
            events.add_metric([name], count)
        yield events


def _results_writer_metrics(writer: Any) -> Iterator[GaugeMetricFamily]:
    """The results writer's buffer (bounded in bytes: results/writer.py) and what it gave up."""
    if writer is None:
        return
    pending = GaugeMetricFamily("kubetune_results_pending_bytes",
                                "Estimated bytes of results waiting for the results store")
    pending.add_metric([], writer.pending_bytes)
    high = GaugeMetricFamily("kubetune_results_pending_high_water_bytes",
                             "The most estimated bytes of results ever waiting for the results store")
    high.add_metric([], writer.high_water_bytes)
    dropped = CounterMetricFamily("kubetune_results_dropped", "Results and failure records dropped: the buffer was "
                                  "full in an outage, or the writer closed before the store took them")
    dropped.add_metric([], writer.dropped)
    rejected = CounterMetricFamily("kubetune_results_rejected_rows",
                                   "Rows the results store refused and that were set aside")
    rejected.add_metric([], sum(r.rows for r in list(writer.rejected.values())))
    yield from (pending, high, dropped, rejected)


_collector: StateCollector | None = None


def watch_state(state: Callable[[], Any]) -> None:
    """Serve the gauges of ``state()`` (idempotent: the last call wins)."""
    global _collector
    if _collector is not None:
        REGISTRY.unregister(_collector)
    _collector = StateCollector(state)
    REGISTRY.register(_collector)


def render() -> bytes:
    return generate_latest(REGISTRY)


async def serve(port: int, host: str = "0.0.0.0"):
    """Start ``GET /metrics`` on the running loop; returns the aiohttp runner (``await
    runner.cleanup()`` to stop)."""
    from aiohttp import web

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("metrics on http://%s:%d/metrics", host, port)
    return runner
