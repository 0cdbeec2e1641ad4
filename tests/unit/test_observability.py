"""kubetune.metrics (gauges from operator state, counters) and the status-transition
Events of controller.status_events; pure, no server."""
from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from kubetune import metrics
from kubetune.controller.status_events import status_events
from kubetune.core.resources import Resources


def samples() -> dict:
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_gauges_follow_the_written_status_and_the_ledgers():
    def controller(phase, **counts):
        return SimpleNamespace(written_status={"phase": phase, "trialCounts": {"created": 9, **counts}})
    ledger = SimpleNamespace(waiting_bundles=lambda: [Resources(cpu=1, gpu=2), Resources(cpu=1, gpu=2)],
                             capacity_known=True, total=Resources(cpu=8, gpu=2), free=lambda: Resources(cpu=7.5),
                             work={"grants": 5, "wakes": 4})
    state = SimpleNamespace(
        controllers={("a", "x"): controller("Running", running=2, queued=2, succeeded=1),
                     ("a", "y"): controller("Succeeded", succeeded=4, failed=1),
                     ("b", "z"): SimpleNamespace(written_status={})},       # nothing written yet
        # finished and at rest: no controller, its counts only
        resting={("b", "done"): {"phase": "Succeeded", "trialCounts": {"succeeded": 3}}},
        registry=SimpleNamespace(platforms=lambda: [SimpleNamespace(address="ray://h:10001", ledger=ledger,
                                                                   connected=True, retired=False)]),
        results=SimpleNamespace(pending_bytes=300, high_water_bytes=4096, dropped=3,
                                rejected={"A": SimpleNamespace(rows=2), "B": SimpleNamespace(rows=1)}))
    metrics.watch_state(lambda: state)
    try:
        got = samples()
    finally:
        metrics.watch_state(lambda: None)
    assert got[("kubetune_experiments", (("phase", "Running"),))] == 1
    assert got[("kubetune_experiments", (("phase", "Succeeded"),))] == 2
    assert got[("kubetune_experiments", (("phase", "Pending"),))] == 1
    assert got[("kubetune_trials", (("phase", "succeeded"),))] == 8
    assert got[("kubetune_trials", (("phase", "queued"),))] == 2
    assert ("kubetune_trials", (("phase", "created"),)) not in got     # not a phase
    assert got[("kubetune_queued_demand", (("resource", "GPU"),))] == 4
    assert got[("kubetune_queued_demand", (("resource", "CPU"),))] == 2
    assert got[("kubetune_queued_bundles", ())] == 2
    assert got[("kubetune_ray_connected", (("address", "ray://h:10001"),))] == 1
    # the exact free amounts a queued Trial's message leaves out
    assert got[("kubetune_cluster_capacity", (("address", "ray://h:10001"), ("resource", "GPU")))] == 2
    assert got[("kubetune_cluster_free", (("address", "ray://h:10001"), ("resource", "CPU")))] == 7.5
    assert got[("kubetune_cluster_free", (("address", "ray://h:10001"), ("resource", "GPU")))] == 0
    # how the ledger hands room over (issue 26: grants against wakes and refusals)
    assert got[("kubetune_ledger_events_total", (("event", "grants"),))] == 5
    assert got[("kubetune_ledger_events_total", (("event", "wakes"),))] == 4
    # the results writer's buffer, bounded in bytes (AUDIT N5), and what it gave up
    assert got[("kubetune_results_pending_high_water_bytes", ())] == 4096
    assert got[("kubetune_results_pending_bytes", ())] == 300
    assert got[("kubetune_results_dropped_total", ())] == 3
    assert got[("kubetune_results_rejected_rows_total", ())] == 3


def test_counters_count():
    before = samples()
    metrics.results_processed(3)
    metrics.api_write("trials", "create")
    metrics.event_posted("Warning", "TrialFailed")
    metrics.reconcile_error("ApiException")
    after = samples()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)
    assert delta("kubetune_results_processed_total") == 3
    assert delta("kubetune_api_writes_total", resource="trials", verb="create") == 1
    assert delta("kubetune_events_total", type="Warning", reason="TrialFailed") == 1
    assert delta("kubetune_reconcile_errors_total", reason="ApiException") == 1


def condition(type_, status, message=""):
    return {"type": type_, "status": status, "reason": "R", "message": message}


def test_queueing_is_announced_once_per_episode():
    running = {"phase": "Running", "queueReason": "", "trialCounts": {"queued": 0}}
    queued = {"phase": "Running", "queueReason": "waiting for 1 GPU; requested scale-up", "trialCounts": {"queued": 3}}
    [(kind, reason, message)] = status_events(running, queued)
    assert (kind, reason) == ("Normal", "TrialsQueued")
    assert message == "3 trial(s) waiting for room: waiting for 1 GPU; requested scale-up"
    assert status_events(queued, {**queued, "queueReason": "waiting for 2 GPU"}) == []
    assert status_events(queued, running) == []
    assert status_events({}, queued)[0][1] == "TrialsQueued"


def test_ray_outage_and_recovery():
    up = {"phase": "Running", "conditions": [condition("Running", "True")]}
    down = {"phase": "Running", "conditions": [condition("RayUnavailable", "True", "cannot reach Ray at x")]}
    back = {"phase": "Running", "conditions": [condition("RayUnavailable", "False")]}
    assert status_events(up, down) == [("Warning", "RayUnavailable", "cannot reach Ray at x")]
    assert status_events(down, down) == []
    assert status_events(down, back)[0][:2] == ("Normal", "RayConnected")
    assert status_events(back, back) == []


def test_suspend_and_resume():
    assert [e[1] for e in status_events({"phase": "Running"}, {"phase": "Suspended"})] == ["Suspended"]
    assert [e[1] for e in status_events({"phase": "Suspended"}, {"phase": "Running"})] == ["Resumed"]
    assert status_events({"phase": "Running"}, {"phase": "Succeeded"}) == []   # posted by the controller
