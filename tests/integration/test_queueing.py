"""Autoscaling-aware queueing (issue 5): GPU trials on a Ray cluster whose head has no
GPU and whose autoscaler adds GPU nodes (Ray's fake multi-node provider: real raylets,
real autoscaler; autoscaler_fixtures).  One operator serves every test of the module,
so its Experiments share one resource ledger, as they would on a real cluster.

The first test needs the cluster without GPU nodes; later ones reuse the nodes it
scaled up (they stay for a minute once idle)."""
from __future__ import annotations

import re
import threading
import time

import pytest

from autoscaler_fixtures import autoscaler_status, gpus_present, requested_bundles
from k8s_helpers import condition, create, experiment, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.controller.conditions import parse_rfc3339
from kubetune.core.feasibility import WAITING_AHEAD

pytestmark = pytest.mark.integration

QUADRATIC = "kubetune.examples.quadratic:train"
SLEEPY = "kubetune.examples.sleepy:train"
SHORT_TRAINING = {"iterations": 6, "delay": 0.3}       # about 2 s per trial


def gpu_experiment(name: str, *, gpus: float = 1, bundles: int = 1, **spec) -> dict:
    trial = {"resources": {"cpu": 0.5, "gpu": gpus, "bundles": bundles}, "config": SHORT_TRAINING,
             **spec.pop("trial", {})}
    return experiment(name, entrypoint=QUADRATIC, trial=trial, **spec)


def phases(api, namespace: str, name: str) -> dict[str, str]:
    return {t["metadata"]["name"]: (t.get("status") or {}).get("phase", "") for t in trials(api, namespace, name)}


def started(trial: dict) -> float:
    return parse_rfc3339(trial["status"]["startTime"])


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def request_withdrawn() -> bool:
    """No standing request_resources, as the autoscaler itself last saw it."""
    report = autoscaler_status().get("load_metrics_report") or {}
    return requested_bundles() == [] and not report.get("request_demand")


class Sampler(threading.Thread):
    """Samples, until stopped, what a user would see: the Trials' phases and messages,
    the Experiment's queue reason and Queued condition; and what Ray has: the standing
    autoscaler request and the GPUs of its nodes."""

    def __init__(self, api, namespace: str, name: str) -> None:
        super().__init__(daemon=True)
        self.api, self.namespace, self.name = api, namespace, name
        self.samples: list[dict] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        try:
            while not self._done.is_set():
                items = trials(self.api, self.namespace, self.name)
                body = get_experiment(self.api, self.namespace, self.name)
                # GPUs read last: a node that came since the previous sample is counted
                # (one that went is in the previous sample's count)
                gpus = gpus_present()
                status = body.get("status") or {}
                self.samples.append({
                    "running": sum((t.get("status") or {}).get("phase") == "Running" for t in items),
                    "queued_messages": [t["status"].get("message", "") for t in items
                                        if (t.get("status") or {}).get("phase") == "Queued"],
                    "queue_reason": status.get("queueReason", ""),
                    "queued_condition": condition(body, "Queued"),
                    "requested_gpus": sum(b.get("GPU", 0) for b in requested_bundles()),
                    "gpus": gpus})
                self._done.wait(0.2)
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self.error = error

    def stop(self) -> list[dict]:
        self._done.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.samples


def test_gpu_trials_queue_while_the_autoscaler_adds_nodes(autoscaling_operator, scaled_down, experiments_api,
                                                          module_namespace):
    api, ns = experiments_api, module_namespace
    assert gpus_present() == 0
    create(api, ns, gpu_experiment("six", budget={"maxTrials": 6, "parallelism": 6}))
    sampler = Sampler(api, ns, "six")
    sampler.start()
    try:
        done = wait_condition(api, ns, "six", "Succeeded", timeout=180, operator=autoscaling_operator)
    finally:
        samples = sampler.stop()

    # queued with the reason, on the Trials and summed up on the Experiment
    trial_reasons = {m for s in samples for m in s["queued_messages"]}
    none_yet = "waiting for 1 GPU: the cluster has 0 GPU; scale-up requested"
    assert none_yet in trial_reasons, trial_reasons
    summaries = {s["queue_reason"] for s in samples}     # how many wait is in trialCounts, not here
    assert none_yet in summaries, summaries
    queued_conditions = [s["queued_condition"] for s in samples if s["queued_condition"]]
    assert any(c["status"] == "True" and c["reason"] == "TrialsQueued" and c["message"] == none_yet
               for c in queued_conditions), queued_conditions
    # the demand reached the autoscaler (held and queued trials: one GPU each) ...
    assert max(s["requested_gpus"] for s in samples) == 6
    # ... which added both GPU nodes, and never was a trial running without a GPU for it
    # (a node the autoscaler is retiring can still show alive beside its replacement,
    # so the peak is not pinned to max_workers)
    peak_gpus = max(s["gpus"] for s in samples)
    assert samples[0]["gpus"] == 0 and peak_gpus >= 1
    # The GPUs present when a sample read the Trials lie between the previous sample's count
    # and its own (read after the Trials): a node can come, or, once the autoscaler retires
    # an idle one, go in between (the whole suite saw 3 running, then 2 GPUs read)
    oversubscribed = [s for before, s in zip(samples, samples[1:]) if s["running"] > max(before["gpus"], s["gpus"])]
    assert not oversubscribed, [(s["running"], s["gpus"]) for s in oversubscribed]

    items = trials(api, ns, "six")
    assert [t["status"]["phase"] for t in items] == ["Succeeded"] * 6
    # by the operator's own start and end times: never more at once than GPUs appeared
    assert max_overlap([(started(t), parse_rfc3339(t["status"]["completionTime"])) for t in items]) <= peak_gpus
    assert done["status"]["trialCounts"]["succeeded"] == 6 and done["status"]["queueReason"] == ""
    assert condition(done, "Queued")["status"] == "False"
    # the request is withdrawn once nothing waits, so the cluster can shrink again
    wait_for(request_withdrawn, timeout=20, interval=0.5, message="the autoscaler request to be withdrawn")


def test_trial_needing_eight_gpus_fails_fast_naming_gpu_and_node_type(autoscaling_operator, experiments_api,
                                                                     module_namespace):
    api, ns = experiments_api, module_namespace
    created = time.monotonic()
    create(api, ns, gpu_experiment("huge", gpus=8, budget={"maxTrials": 3}))
    failed = wait_condition(api, ns, "huge", "Failed", timeout=60, operator=autoscaling_operator)
    assert time.monotonic() - created < 20
    message = "needs 8 GPU per bundle; the largest node type offers 1 GPU"
    assert condition(failed, "Failed")["reason"] == "Infeasible"
    assert message in condition(failed, "Failed")["message"]
    (trial,) = trials(api, ns, "huge")
    assert (trial["status"]["phase"], trial["status"]["reason"], trial["status"]["message"]) == \
        ("Failed", "Infeasible", message)
    assert not any(bundle.get("GPU", 0) >= 8 for bundle in requested_bundles())


def gated_experiment(name: str, gate, *, count: int, **spec) -> dict:
    """1-GPU trials that report once, then wait for ``gate`` (a file) before two more reports."""
    return experiment(name, entrypoint=SLEEPY, objective={"metric": "step", "mode": "max"},
                      budget={"maxTrials": count, "parallelism": count},
                      trial={"resources": {"cpu": 0.5, "gpu": 1},
                             "config": {"iterations": 3, "interval": 0.2, "hold_after": 1, "gate": str(gate)}},
                      **spec)


def test_two_experiments_share_the_cluster_and_priority_goes_first(autoscaling_operator, experiments_api,
                                                                   module_namespace, tmp_path):
    api, ns = experiments_api, module_namespace
    gate = tmp_path / "gate"
    try:
        create(api, ns, gated_experiment("low", gate, count=4))
        # both GPUs held by "low" (its trials wait at the gate), its other two trials queued
        wait_for(lambda: sorted(phases(api, ns, "low").values()) == ["Queued", "Queued", "Running", "Running"],
                 timeout=120, interval=0.2, message="low: 2 running, 2 queued")
        create(api, ns, gated_experiment("high", gate, count=2, priority=10))
        wait_for(lambda: list(phases(api, ns, "high").values()) == ["Queued", "Queued"],
                 timeout=60, interval=0.2, message="high: 2 queued")
        # the Trials' phases and the Experiment's summary are separate writes: wait for the summary
        expected = f"waiting for 1 GPU of the cluster's 2: {WAITING_AHEAD}; scale-up requested"
        wait_for(lambda: (get_experiment(api, ns, "high").get("status") or {}).get("queueReason") == expected,
                 timeout=30, interval=0.2, message=f"high's queueReason {expected!r}")
    finally:
        # release the held GPUs whatever happened, or every later test of the module waits for them
        gate.touch()
    wait_condition(api, ns, "high", "Succeeded", timeout=120, operator=autoscaling_operator)
    wait_condition(api, ns, "low", "Succeeded", timeout=120, operator=autoscaling_operator)

    low, high = trials(api, ns, "low"), trials(api, ns, "high")
    assert [t["status"]["phase"] for t in [*low, *high]] == ["Succeeded"] * 6
    first_low = sorted(low, key=started)[:2]
    later_low = sorted(low, key=started)[2:]
    # the higher priority overtook the trials of "low" that waited before it came ...
    assert max(map(started, high)) < min(map(started, later_low))
    # ... which did not starve: the two experiments ran interleaved on the two GPUs
    assert max(map(started, first_low)) < min(map(started, high))
    assert max(t["status"]["attempt"] for t in [*low, *high]) == 0


def test_two_bundle_trial_starts_only_when_both_bundles_fit(autoscaling_operator, experiments_api,
                                                           module_namespace, tmp_path):
    import ray
    api, ns = experiments_api, module_namespace
    gate = tmp_path / "gate"
    try:
        create(api, ns, gated_experiment("hold", gate, count=1))
        wait_for(lambda: [(t.get("status") or {}).get("iteration") for t in trials(api, ns, "hold")] == [1],
                 timeout=120, interval=0.2, message="hold-0 running on a GPU node")
        create(api, ns, gpu_experiment("pair", bundles=2, budget={"maxTrials": 1}))

        def pair_queue_reason() -> str:
            items = trials(api, ns, "pair")
            status = (items[0].get("status") or {}) if items else {}
            return status.get("message", "") if status.get("phase") == "Queued" else ""

        # both GPU nodes up, one GPU held: not enough for the pair, and nothing of it is reserved
        expected = f"waiting for 2 GPU of the cluster's 2: {WAITING_AHEAD}; scale-up requested"
        wait_for(lambda: pair_queue_reason() == expected,
                 timeout=120, interval=0.2, message="pair-0 queued with one of two GPUs held")
        wait_for(lambda: (get_experiment(api, ns, "pair").get("status") or {}).get("queueReason") == expected,
                 timeout=30, interval=0.2, message=f"pair's queueReason {expected!r}")
        assert not [pg for pg in ray.util.placement_group_table().values() if f"/{ns}/pair/" in pg["name"]]
    finally:
        # release the held GPU whatever happened, or every later test of the module waits for it
        gate.touch()

    def pair_group() -> dict | None:
        groups = [pg for pg in ray.util.placement_group_table().values()
                  if f"/{ns}/pair/" in pg["name"] and pg["state"] == "CREATED"]
        return groups[0] if groups else None
    group = wait_for(pair_group, timeout=120, interval=0.1, message="the pair's placement group")
    assert sorted(bundle.get("GPU") for bundle in group["bundles"].values()) == [1.0, 1.0]
    wait_condition(api, ns, "pair", "Succeeded", timeout=120, operator=autoscaling_operator)
    (held,), (pair,) = trials(api, ns, "hold"), trials(api, ns, "pair")
    assert held["status"]["phase"] == pair["status"]["phase"] == "Succeeded"
    assert started(pair) >= parse_rfc3339(held["status"]["completionTime"])


def test_queue_timeout_fails_a_trial_that_waits_too_long(autoscaling_operator, experiments_api,
                                                        module_namespace):
    api, ns = experiments_api, module_namespace
    # each bundle fits a GPU node, but three never fit the two nodes the autoscaler may add
    create(api, ns, gpu_experiment("patient", bundles=3, budget={"maxTrials": 1}, trial={"queueTimeout": "5s"}))
    failed = wait_condition(api, ns, "patient", "Failed", timeout=60, operator=autoscaling_operator)
    (trial,) = trials(api, ns, "patient")
    assert (trial["status"]["phase"], trial["status"]["reason"]) == ("Failed", "QueueTimeout")
    assert re.fullmatch(r"queued for [5-9]s \(queueTimeout 5s\): waiting for 3 GPU: the cluster has [0-2] GPU; "
                        r"scale-up requested", trial["status"]["message"]), trial["status"]["message"]
    assert "startTime" not in trial["status"]
    assert failed["status"]["trialCounts"]["failed"] == 1
    wait_for(request_withdrawn, timeout=20, interval=0.5, message="the autoscaler request to be withdrawn")


def test_an_experiment_ending_with_trials_queued_withdraws_its_request(autoscaling_operator, experiments_api,
                                                                       module_namespace):
    api, ns = experiments_api, module_namespace
    # its trial never fits (three GPU bundles, two nodes at most) but asks for a scale-up;
    # maxDuration ends the Experiment with the trial still queued
    create(api, ns, gpu_experiment("short-lived", bundles=3, budget={"maxTrials": 1, "maxDuration": "5s"}))
    wait_for(lambda: any(b.get("GPU") for b in requested_bundles()), timeout=60, interval=0.5,
             message="the scale-up request")
    wait_for(lambda: (get_experiment(api, ns, "short-lived").get("status") or {}).get("completionTime"),
             timeout=60, interval=0.5, message="the Experiment to finish")
    # a finished Experiment's cycles make no Ray call: the request must still go with it
    wait_for(request_withdrawn, timeout=20, interval=0.5, message="the autoscaler request to be withdrawn")
