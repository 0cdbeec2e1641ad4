"""Issue 15 item 1: decisions are effects retried until they hold.  Transient API
errors (a real proxy in front of the real API server answering 429) must neither
lose a stop -- a stopped trial keeping its slot on Ray while another launches -- nor
a Trial, nor freeze the Experiment."""
from __future__ import annotations

import itertools
import json
import re

import pytest

from flaky_apiserver import FlakyApiServer
from k8s_helpers import condition, create, experiment, trials, wait_condition
from kube_fixtures import wait_for
from operator_fixtures import OperatorProcess
from test_operator import max_overlap

pytestmark = pytest.mark.integration

# kubetune's own writes: Trial creation, Trial and Experiment status
KUBETUNE_WRITE = re.compile(r"/apis/kubetune\.dev/v1alpha1/namespaces/[^/]+/(trials(/[^/]+/status)?|"
                            r"experiments/[^/]+/status)$")


@pytest.fixture
def operator_behind(kube_cluster, ray_local, namespace, tmp_path):
    """``operator_behind(fail)``: the operator process talking to the API server through
    a FlakyApiServer that refuses what ``fail`` says."""
    started = []

    def start(fail):
        proxy = FlakyApiServer(kube_cluster.kubeconfig, tmp_path, fail)
        process = OperatorProcess(proxy.start(), ray_local, tmp_path, namespace).start()
        started.append((process, proxy))
        return process, proxy
    yield start
    for process, proxy in started:
        process.stop_and_report()
        proxy.stop()


@pytest.fixture
def flaky_operator(operator_behind):
    writes = itertools.count()

    def fail(method: str, path: str) -> int | None:     # every third write of kubetune's
        if method in ("POST", "PATCH", "PUT") and KUBETUNE_WRITE.search(path) and next(writes) % 3 == 1:
            return 429
        return None
    return operator_behind(fail)


def test_parallelism_2_never_runs_3_with_transient_api_errors(flaky_operator, experiments_api, namespace, tmp_path):
    operator, proxy = flaky_operator
    record_dir = tmp_path / "runs"
    record_dir.mkdir()
    body = experiment("flaky-api", entrypoint="kubetune.examples.paced:train",
                      objective={"metric": "loss", "mode": "min"},
                      search_space={"x": {"uniform": [0, 1]}}, search={"algorithm": "random", "seed": 5},
                      scheduler={"type": "asha", "maxIterations": 16, "gracePeriod": 1, "reductionFactor": 2},
                      budget={"maxTrials": 8, "parallelism": 2},
                      trial={"config": {"iterations": 16, "interval": 0.1, "record_dir": str(record_dir)}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "flaky-api", "Succeeded", timeout=240, operator=operator)

    assert proxy.refused >= 10, "the proxy refused too few writes for the test to mean anything"
    items = trials(experiments_api, namespace, "flaky-api")
    assert [t["metadata"]["name"] for t in items] == [f"flaky-api-{i}" for i in range(8)]
    stopped = [t for t in items if t["status"]["phase"] == "Stopped"]
    assert stopped and all(t["status"]["reason"] == "EarlyStopped" for t in stopped)
    assert done["status"]["trialCounts"]["succeeded"] + len(stopped) == 8, \
        [(t["status"]["phase"], t["status"].get("reason"), t["status"].get("message")) for t in items]

    runs = [json.loads(path.read_text()) for path in record_dir.iterdir()]
    assert len(runs) >= 8
    # what ran on Ray, as the trial functions themselves recorded it: never three at once
    assert max_overlap([(run["start"], run["alive"]) for run in runs]) <= 2


def test_a_trial_whose_writes_are_refused_stops_nothing_and_is_shown(operator_behind, experiments_api, namespace,
                                                                      kube_cluster):
    # an admission webhook that refuses every status write of one Trial, for good
    operator, proxy = operator_behind(lambda method, path: 422 if method == "PATCH" and
                                      path.endswith("/trials/iso-1/status") else None)
    body = experiment("iso", search_space={"x": {"choice": [0.0, 1.0, 2.0]}}, search={"algorithm": "grid"},
                      budget={"maxTrials": 3, "parallelism": 3}, trial={"config": {"iterations": 3}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "iso", "Succeeded", timeout=180, operator=operator)

    shown = condition(done, "StatusWriteFailed")
    assert shown["status"] == "True" and shown["reason"] == "Invalid"
    assert "Trial iso-1" in shown["message"] and "422 Invalid" in shown["message"]
    assert len(shown["message"].encode()) <= 1024
    items = {t["metadata"]["name"]: t for t in trials(experiments_api, namespace, "iso")}
    assert "status" not in items["iso-1"] and proxy.refused >= 1
    for name in ("iso-0", "iso-2"):
        assert items[name]["status"]["phase"] == "Succeeded" and items[name]["status"]["iteration"] == 3
    assert done["status"]["trialCounts"]["succeeded"] == 3

    def warning_reasons():
        import kubernetes
        with kube_cluster.api_client() as client:
            events = kubernetes.client.CoreV1Api(client).list_namespaced_event(
                namespace, field_selector="involvedObject.name=iso").items
        return {event.reason for event in events if event.type == "Warning"}
    wait_for(lambda: "StatusWriteFailed" in warning_reasons(), timeout=30, message="a StatusWriteFailed Event")

