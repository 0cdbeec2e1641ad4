"""Every result the operator receives lands in the results store, SQLite or a real
PostgreSQL, and `kubetune results` reads it back; a store outage is shown on the
Experiment and costs no result."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time

import optuna
import pytest
from kubernetes import client

from k8s_helpers import create, experiment, get_experiment, wait_condition
from kube_fixtures import wait_for
from kubetune.dashboard.storage import ResultsStoreStorage
from kubetune.results import open_store
from operator_fixtures import OperatorProcess

pytestmark = pytest.mark.integration
DASHBOARD = "https://tuning.example.com/"


def kubetune_results(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kubetune", "results", *args, "--store", url],
                          capture_output=True, text=True, timeout=120)


def stored_results(url: str, name: str, namespace: str) -> dict | None:
    listed = kubetune_results(url, name, "-n", namespace, "-o", "json")
    if listed.returncode != 0:
        return None
    # strict JSON: a NaN or Infinity literal would fail here
    return json.loads(listed.stdout, parse_constant=lambda constant: pytest.fail(f"invalid JSON: {constant}"))


def flaky_experiment(name: str) -> dict:
    """Two trials, each failing once after iteration 3 and resuming from its checkpoint."""
    return experiment(name, entrypoint="kubetune.examples.flaky:train", search_space={"lr": {"choice": [0.1, 0.2]}},
                      search={"algorithm": "grid"}, budget={"maxTrials": 2, "parallelism": 2},
                      trial={"config": {"iterations": 8, "fail_at": 3}, "maxFailures": 1})


@pytest.fixture(params=["sqlite", "postgresql"])
def store_operator(request, kube_cluster, ray_local, namespace, tmp_path):
    process = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, namespace,
                              extra_args=("--dashboard-url", DASHBOARD))
    if request.param == "postgresql":
        process.results_url = request.getfixturevalue("postgres_url")
    process.start()
    yield process
    process.stop_and_report()


def test_every_result_and_failed_attempt_is_stored_and_read_back(store_operator, experiments_api, namespace,
                                                                  tmp_path):
    create(experiments_api, namespace, flaky_experiment("stored"))
    wait_condition(experiments_api, namespace, "stored", "Succeeded", timeout=180, operator=store_operator)
    url = store_operator.results_url

    def complete():
        document = stored_results(url, "stored", namespace)
        if document and sum(len(t["results"]) for t in document["trials"]) == 16 \
                and all(t["phase"] == "Succeeded" for t in document["trials"]):
            return document
        return None
    document = wait_for(complete, timeout=60, interval=0.5, message="16 stored results")

    experiment = get_experiment(experiments_api, namespace, "stored")
    uid = experiment["metadata"]["uid"]
    assert document["experiment"]["uid"] == uid and document["experiment"]["metric"] == "val_loss"
    # the chart's dashboard (a base URL given to the operator): the Experiment names its page
    assert experiment["status"]["dashboard"] == f"https://tuning.example.com/experiments/{namespace}/stored"
    # and the dashboard's study of it, from what the operator stored (kubetune.dashboard)
    reader = ResultsStoreStorage(open_store(url, read_only=True))
    study = optuna.load_study(study_name=f"{namespace}/stored", storage=reader)
    assert reader.study_id_for(namespace, "stored") == study._study_id
    assert study.direction == optuna.study.StudyDirection.MINIMIZE and study.metric_names == ["val_loss"]
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    for frozen in study.trials:
        assert frozen.intermediate_values == {i: pytest.approx(1 / i) for i in range(1, 9)}
        assert frozen.value == pytest.approx(1 / 8) and frozen.params["lr"] in (0.1, 0.2)
        assert frozen.distributions["lr"] == optuna.distributions.CategoricalDistribution([0.1, 0.2])
    reader.store.close()
    for trial in document["trials"]:
        # the history has no gap and no duplicate across the retry; each result says its attempt
        assert [r["iteration"] for r in trial["results"]] == list(range(1, 9))
        assert [r["metrics"]["score"] for r in trial["results"]] == list(range(1, 9))
        assert [r["attempt"] for r in trial["results"]] == [0] * 3 + [1] * 5
        assert trial["params"]["lr"] in (0.1, 0.2) and trial["best"] == pytest.approx(1 / 8)
        [failure] = trial["failures"]
        assert failure["attempt"] == 0
        assert failure["message"].startswith("RuntimeError: flaky failure after iteration 3")
        assert "Traceback" in failure["message"]

    one = document["trials"][0]["name"]
    listed = kubetune_results(url, "stored", "-n", namespace, "--trial", one, "-o", "csv",
                              "--plot", str(tmp_path / "plots"))
    assert listed.returncode == 0, listed.stderr
    rows = list(csv.DictReader(io.StringIO(listed.stdout)))
    assert [(r["trial"], int(r["iteration"]), float(r["val_loss"])) for r in rows] == \
        [(one, i, pytest.approx(1 / i)) for i in range(1, 9)]
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"history.png", "curves.png", "parallel.png"}
    table = kubetune_results(url, "stored", "-n", namespace)
    assert table.returncode == 0 and len(table.stdout.splitlines()) >= 17 and "FAILED ATTEMPTS" in table.stdout


def test_a_results_store_outage_is_shown_and_costs_no_result(kube_cluster, ray_local, namespace, tmp_path,
                                                             experiments_api, postgres_server):
    """The operator's database does not exist yet: the Experiment says so (condition and
    Warning Event) and runs on; once the database exists every result is written."""
    database = f"outage_{int(time.time() * 1000)}"
    process = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, namespace)
    process.results_url = postgres_server.url(database)
    process.start()
    try:
        create(experiments_api, namespace, flaky_experiment("outage"))
        down = wait_condition(experiments_api, namespace, "outage", "ResultsStoreUnavailable", timeout=120,
                              operator=process)
        message = next(c for c in down["status"]["conditions"] if c["type"] == "ResultsStoreUnavailable")["message"]
        # every tenant sees this condition: the error's class only, its text (SQL, rows) is in the log
        assert "OperationalError" in message and "operator log" in message and database not in message
        postgres_server.create_database(database)
        wait_condition(experiments_api, namespace, "outage", "Succeeded", timeout=180, operator=process)

        def recovered():
            body = get_experiment(experiments_api, namespace, "outage")
            found = [c for c in body["status"]["conditions"] if c["type"] == "ResultsStoreUnavailable"]
            return found and found[0]["status"] == "False"
        wait_for(recovered, timeout=90, interval=0.5, message="ResultsStoreUnavailable False")

        def complete():
            document = stored_results(process.results_url, "outage", namespace)
            return document and sum(len(t["results"]) for t in document["trials"]) == 16
        wait_for(complete, timeout=60, interval=0.5, message="all 16 results stored after the outage")
        with kube_cluster.api_client() as api:
            events = client.CoreV1Api(api).list_namespaced_event(
                namespace, field_selector="involvedObject.name=outage").items
        reasons = {(e.type, e.reason) for e in events}
        assert ("Warning", "ResultsStoreUnavailable") in reasons and ("Normal", "ResultsStored") in reasons
    finally:
        process.stop_and_report()


def test_results_held_by_a_killed_operator_are_stored_by_the_next(kube_cluster, ray_local, namespace, tmp_path,
                                                                  experiments_api, postgres_server):
    """The operator took 10 results (the Trial's status records them) but could not store
    them yet (its database does not exist) when it is SIGKILLed.  The restarted operator
    finds them missing from the store and fetches them again from the running trial."""
    database = f"killed_{int(time.time() * 1000)}"
    process = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, namespace)
    process.results_url = postgres_server.url(database)
    process.start()
    gate = tmp_path / "gate"
    create(experiments_api, namespace, experiment(
        "killed", entrypoint="kubetune.examples.sleepy:train", objective={"metric": "step", "mode": "max"},
        budget={"maxTrials": 1, "parallelism": 1},
        trial={"config": {"iterations": 15, "interval": 0, "hold_after": 10, "gate": str(gate)}}))
    try:
        def ten_recorded():
            items = experiments_api.list_namespaced_custom_object(
                "kubetune.dev", "v1alpha1", namespace, "trials", label_selector="kubetune.dev/experiment=killed")
            return items["items"] and (items["items"][0].get("status") or {}).get("lastResultSeq") == 9
        wait_for(ten_recorded, timeout=120, interval=0.2, message="the Trial records 10 results")
        wait_condition(experiments_api, namespace, "killed", "ResultsStoreUnavailable", timeout=60, operator=process)
        process.kill()
        postgres_server.create_database(database)
        process.start()
        gate.touch()
        wait_condition(experiments_api, namespace, "killed", "Succeeded", timeout=120, operator=process)

        def all_stored():
            document = stored_results(process.results_url, "killed", namespace)
            return document if document and len(document["trials"][0]["results"]) >= 15 else None
        document = wait_for(all_stored, timeout=60, interval=0.5, message="15 stored results")
        assert [r["metrics"]["step"] for r in document["trials"][0]["results"]] == list(range(1, 16))
    finally:
        process.stop_and_report()
