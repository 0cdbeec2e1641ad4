"""Issue 14: NaN and Infinity from a trial never freeze an Experiment.  Real
kube-apiserver, real Ray, the operator process; ``kubectl get``'s view is the API
server's Table rendering, fetched as kubectl fetches it."""
from __future__ import annotations

import math

import pytest

from k8s_helpers import create, experiment, get_experiment, table, trials, wait_condition
from kube_fixtures import wait_for

pytestmark = pytest.mark.integration

NON_FINITE = {"NaN", "Infinity", "-Infinity"}


def kubectl_get(kube_cluster, namespace: str, plural: str) -> list[dict]:
    """The rows ``kubectl get <plural>`` prints, by column name."""
    with kube_cluster.api_client() as client:
        columns, rows = table(client, namespace, plural)
    return [dict(zip(columns, cells)) for cells in rows]


def diverging_experiment(name: str, **config) -> dict:
    return experiment(name, entrypoint="kubetune.examples.diverging:train",
                      objective={"metric": "loss", "mode": "min"},
                      search_space={"lr": {"choice": [0.05, 0.2, 0.7, 0.9]}}, search={"algorithm": "grid"},
                      budget={"maxTrials": 4, "parallelism": 2}, trial={"config": {"iterations": 6, **config}})


def check_succeeded_with_finite_best(api, namespace: str, name: str, kube_cluster, operator) -> None:
    done = wait_condition(api, namespace, name, "Succeeded", timeout=180, operator=operator)
    best = done["status"]["bestTrial"]
    assert isinstance(best["metric"], float) and math.isfinite(best["metric"])
    assert best["parameters"] == {"lr": 0.05}
    assert done["status"]["trialCounts"]["succeeded"] == 4

    items = trials(api, namespace, name)
    by_lr = {t["spec"]["parameters"]["lr"]: t["status"] for t in items}
    diverged = {t["metadata"]["name"] for t in items if t["spec"]["parameters"]["lr"] > 0.5}
    for lr in (0.7, 0.9):
        status = by_lr[lr]
        assert status["phase"] == "Succeeded" and status["iteration"] == 6
        assert status["lastObjective"] in NON_FINITE
        assert status["lastMetrics"]["grad_norm"] == "Infinity"
        assert [point["loss"] for point in status["history"][1:4]] == ["-Infinity", "NaN", "Infinity"]
        assert status["bestMetric"] == pytest.approx((lr - 0.1) ** 2 + 1.0)   # its one finite value
    assert by_lr[0.05]["lastObjective"] == pytest.approx((0.05 - 0.1) ** 2 + 1 / 6)

    rows = {row["Name"]: row for row in kubectl_get(kube_cluster, namespace, "trials")}
    assert {rows[trial]["Last"] for trial in diverged} <= NON_FINITE
    assert all(isinstance(row["Metric"], float) for row in rows.values())
    (row,) = [row for row in kubectl_get(kube_cluster, namespace, "experiments") if row["Name"] == name]
    assert row["Phase"] == "Succeeded" and row["Best"] == pytest.approx(best["metric"])


def test_nan_and_infinity_reach_succeeded_with_a_finite_best_and_readable_values(
        operator, experiments_api, namespace, kube_cluster):
    create(experiments_api, namespace, diverging_experiment("diverge"))
    check_succeeded_with_finite_best(experiments_api, namespace, "diverge", kube_cluster, operator)


def test_the_same_after_an_operator_sigkill_halfway(operator, experiments_api, namespace, kube_cluster):
    create(experiments_api, namespace, diverging_experiment("killed", delay=0.4))

    def some_diverged():
        return any((t.get("status") or {}).get("lastObjective") in NON_FINITE
                   for t in trials(experiments_api, namespace, "killed"))
    wait_for(some_diverged, timeout=120, message="a trial to report a non-finite loss")
    operator.kill()
    assert get_experiment(experiments_api, namespace, "killed")["status"]["phase"] == "Running"
    operator.start()
    check_succeeded_with_finite_best(experiments_api, namespace, "killed", kube_cluster, operator)


def test_only_non_finite_values_are_named_as_the_cause_in_the_message(
        operator, experiments_api, namespace, kubectl):
    """Every trial reported the objective, only ever NaN or ±Infinity: the line a user reads
    first (kubectl get -o wide's MESSAGE, the Failed condition) says so and what to do,
    not that no trial reported it."""
    body = diverging_experiment("all-diverge", diverge_above=0.0, diverge_from=1)
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "all-diverge", "Failed", timeout=180, operator=operator)
    wide = kubectl("get", "experiment", "all-diverge", "-n", namespace, "-o", "wide").stdout
    for message in (wide, done["status"]["message"]):
        assert "no trial reported" not in message, message
        assert "every value the 4 trials reported was NaN or ±Infinity" in message, message
        assert "a non-finite value never counts as best" in message, message
    assert "bestTrial" not in done["status"]
