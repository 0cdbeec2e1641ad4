"""Failures a new user meets, through kubectl against the real API server and a running
operator: each one ends with a message on the Experiment that says what to fix."""
from __future__ import annotations

import json

import pytest

from k8s_helpers import condition, experiment, experiment_gone, get_experiment, trials, wait_condition
from kube_fixtures import wait_for

pytestmark = pytest.mark.integration


def kubectl_create(kubectl, namespace: str, body: dict) -> None:
    # `kubectl create`, not `apply`: apply copies the object into its own annotation,
    # which a spec over 256 KiB cannot fit (kubectl refuses before the API sees it)
    kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))


def test_a_spec_too_large_fails_with_a_message_about_the_search_space_and_deletes(
        operator, experiments_api, kubectl, namespace):
    # ~400 KiB of choices: within every per-field bound of the CRD, over kopf's old
    # annotation copy (256 KiB) and over the parser's limit on a whole search space
    space = {f"p{i}": {"choice": [f"{i}-{j}-" + "v" * 200 for j in range(30)]} for i in range(64)}
    body = experiment("huge", search_space=space)
    assert len(json.dumps(body)) > 300 * 1024
    kubectl_create(kubectl, namespace, body)

    failed = wait_condition(experiments_api, namespace, "huge", "Failed", timeout=60, operator=operator)
    reason = condition(failed, "Failed")
    assert reason["reason"] == "InvalidSpec"
    assert "spec.searchSpace: is too large" in reason["message"], reason["message"]
    annotations = failed["metadata"].get("annotations") or {}
    assert sum(len(value) for value in annotations.values()) < 2048, annotations   # a digest, not a copy

    kubectl("delete", "-n", namespace, "experiment", "huge", "--timeout=60s", timeout=90)
    wait_for(lambda: experiment_gone(experiments_api, namespace, "huge"), timeout=30, message="huge deleted")


def test_a_spec_change_still_wakes_the_controller(operator, experiments_api, kubectl, namespace):
    # the diff base is a digest now: a changed spec must still count as a change
    body = experiment("grows", budget={"maxTrials": 1, "parallelism": 1})
    kubectl_create(kubectl, namespace, body)
    wait_condition(experiments_api, namespace, "grows", "Succeeded", timeout=90, operator=operator)
    kubectl("patch", "-n", namespace, "experiment", "grows", "--type=merge",
            "-p", json.dumps({"spec": {"budget": {"maxTrials": 2}}}))

    def second_trial_done():
        status = get_experiment(experiments_api, namespace, "grows").get("status") or {}
        return (status.get("trialCounts") or {}).get("succeeded") == 2
    wait_for(second_trial_done, timeout=90, interval=0.5, message="the second trial after the spec change")


# (entrypoint, Failed reason, words the Experiment's message and condition must contain)
SYSTEMATIC = [
    ("nope_missing.module:train", "SystematicFailure", "No module named 'nope_missing'"),
    ("kubetune.examples.quadratic:no_such_function", "SystematicFailure", "no_such_function"),
    ("kubetune.examples.misbehaving:NOT_CALLABLE", "SystematicFailure", "is not callable"),
    ("kubetune.examples.misbehaving:exits", "SystematicFailure", "called sys.exit(0)"),
    ("kubetune.examples.misbehaving:reports_text", "SystematicFailure",
     "val_loss was reported as a str ('0.25'), not a number"),
    ("kubetune.examples.misbehaving:returns_metrics", "SystematicFailure",
     "NoResultsReported: the entrypoint kubetune.examples.misbehaving:returns_metrics returned without reporting"),
]


@pytest.mark.parametrize("entrypoint,reason,words", SYSTEMATIC, ids=[s[0].split(":")[-1] for s in SYSTEMATIC])
def test_a_systematic_trial_failure_fails_the_experiment_fast_naming_it(
        operator, experiments_api, kubectl, namespace, entrypoint, reason, words):
    body = experiment("broken", entrypoint=entrypoint, budget={"maxTrials": 20, "parallelism": 1})
    kubectl_create(kubectl, namespace, body)
    failed = wait_condition(experiments_api, namespace, "broken", "Failed", timeout=120, operator=operator)
    found = condition(failed, "Failed")
    assert found["reason"] == reason, found
    assert words in found["message"] and words in failed["status"]["message"], found["message"]
    assert "most often" in failed["status"]["message"]
    # fast: the budget was 20 trials
    assert failed["status"]["trialCounts"]["created"] <= 3, failed["status"]


def test_pbt_whose_function_never_checkpoints_gets_a_warning(operator, experiments_api, kubectl, namespace,
                                                             tmp_path):
    gate = tmp_path / "gate"
    # checkpoint_every 0: the function saves nothing unless a pause asks. The four trials
    # wait after iteration 1 until all have got there, so that they are ranked together
    # however far apart a loaded machine starts them.
    body = experiment("pbt-no-ckpt", entrypoint="kubetune.examples.resumable:train",
                      objective={"metric": "loss", "mode": "min"},
                      search_space={"lr": {"loguniform": [0.01, 0.9]}},
                      scheduler={"type": "pbt", "maxIterations": 12, "perturbationInterval": 2},
                      budget={"maxTrials": 4, "parallelism": 4},
                      trial={"config": {"iterations": 12, "interval": 0.3, "checkpoint_every": 0,
                                        "hold_at": 1, "gate": str(gate)}})
    kubectl_create(kubectl, namespace, body)
    wait_for(lambda: [(t.get("status") or {}).get("iteration") for t in trials(experiments_api, namespace,
                                                                               "pbt-no-ckpt")] == [1] * 4,
             timeout=90, message="all four trials to wait after iteration 1")
    gate.touch()
    warned = wait_condition(experiments_api, namespace, "pbt-no-ckpt", "SchedulerWarning", timeout=120,
                            operator=operator)
    assert "no trial in the top" in condition(warned, "SchedulerWarning")["message"]

    def warning_event():
        events = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
        return [e for e in events if e.get("reason") == "SchedulerCannotAct" and e.get("type") == "Warning"]
    wait_for(warning_event, timeout=30, message="a SchedulerCannotAct Warning Event")


@pytest.mark.parametrize("name,resources,message", [
    # the case: every bundle fits a node, the group never fits the cluster
    ("thousand", {"cpu": 1, "bundles": 1000},
     "needs 1000 bundles, 1000 CPU in all, placed together; the whole cluster (1 node) offers 8 CPU"),
    ("gpus", {"cpu": 0.5, "gpu": 1, "bundles": 5},
     "needs 5 bundles, 5 GPU in all, placed together; the whole cluster (1 node) offers 4 GPU"),
])
def test_a_placement_group_larger_than_the_cluster_fails_at_once_naming_it(
        operator, experiments_api, kubectl, namespace, name, resources, message):
    # real Ray (ray_local: one node, 8 CPU, 4 GPU, no autoscaler): judged on the whole group,
    # as a single bundle too large for any node is, instead of waiting forever
    body = experiment(name, budget={"maxTrials": 3, "parallelism": 1}, trial={"resources": resources})
    kubectl_create(kubectl, namespace, body)
    failed = wait_condition(experiments_api, namespace, name, "Failed", timeout=120, operator=operator)
    found = condition(failed, "Failed")
    assert found["reason"] == "Infeasible" and message in found["message"], found
    assert message in failed["status"]["message"]
    [trial] = trials(experiments_api, namespace, name)
    assert (trial["status"]["phase"], trial["status"]["reason"]) == ("Failed", "Infeasible")
    assert message in trial["status"]["message"]


def test_a_cut_string_and_a_flood_of_results_are_said_once_on_the_trial(operator, experiments_api, kubectl, namespace):
    """A 1 MB metric string and thousands of results in a second are cut and thinned by
    the Trial's bounded status: `kubectl describe trial` says so once each (Warning
    Events), naming the metric and where every result is whole."""
    create = experiments_api.create_namespaced_custom_object
    create("kubetune.dev", "v1alpha1", namespace, "experiments", experiment(
        "flood", entrypoint="kubetune.examples.misbehaving:floods", budget={"maxTrials": 1},
        trial={"config": {"results": 5_000}}))
    wait_condition(experiments_api, namespace, "flood", "Succeeded", timeout=240, operator=operator)

    def described():
        text = kubectl("describe", "trial", "flood-0", "-n", namespace).stdout
        return text if "ResultCut" in text and "ResultsThinned" in text else None
    text = wait_for(described, timeout=60, interval=0.5, message="both Warnings on the Trial")
    assert "metric 'log' is a 1,000,000-character string" in text, text
    assert "kubetune results flood --trial flood-0" in text, text
    events = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json",
                                "--field-selector", "involvedObject.name=flood-0,type=Warning").stdout)["items"]
    said = [(e["reason"], e.get("count") or 1) for e in events if e["reason"] in ("ResultCut", "ResultsThinned")]
    assert sorted(said) == [("ResultCut", 1), ("ResultsThinned", 1)], said
