"""The Experiment lifecycle across restarts, re-creation and spec edits (issue 15):
finished stays finished, a re-created Experiment never adopts the old one's Trials,
conditions describe the current generation, and ``local`` inside a cluster is
refused unless allowed (a bad Ray address: test_ray_addresses.py)."""
from __future__ import annotations

import pytest

from k8s_helpers import (GROUP, VERSION, condition, create, experiment, experiment_gone, get_experiment,
                         trials, wait_condition)
from kube_fixtures import wait_for
from kubectl_wait import condition_met
from recovery_fixtures import OperatorWithEnv

pytestmark = pytest.mark.integration

QUICK = {"config": {"iterations": 3}}


def patch_spec(api, namespace: str, name: str, spec: dict) -> None:
    api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name, {"spec": spec})


def events(kube_cluster, namespace: str, name: str) -> list:
    import kubernetes
    with kube_cluster.api_client() as client:
        return kubernetes.client.CoreV1Api(client).list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}").items


def test_finished_experiments_start_nothing_after_a_restart(operator, experiments_api, namespace):
    # GoalReached with the first trial (4 more allowed), and Infeasible (no node has 1000 CPUs)
    create(experiments_api, namespace, experiment(
        "goal", objective={"goal": 100.0}, budget={"maxTrials": 5, "parallelism": 1}, trial=QUICK))
    create(experiments_api, namespace, experiment(
        "huge", budget={"maxTrials": 5, "parallelism": 1}, trial={"resources": {"cpu": 1000}, **QUICK}))
    goal = wait_condition(experiments_api, namespace, "goal", "Succeeded", timeout=180, operator=operator)
    huge = wait_condition(experiments_api, namespace, "huge", "Failed", timeout=180, operator=operator)
    assert condition(goal, "Succeeded")["reason"] == "GoalReached"
    assert condition(huge, "Failed")["reason"] == "Infeasible"
    before = {name: [t["metadata"]["uid"] for t in trials(experiments_api, namespace, name)]
              for name in ("goal", "huge")}
    assert [len(uids) for uids in before.values()] == [1, 1]

    for _ in range(2):
        operator.kill()
        operator.start()
        # an Experiment created after the restart finishing proves the restarted operator
        # has served its Experiments for a while
        marker = f"after-{operator.starts}"
        create(experiments_api, namespace, experiment(marker, budget={"maxTrials": 1}, trial=QUICK))
        wait_condition(experiments_api, namespace, marker, "Succeeded", timeout=180, operator=operator)
        for name in ("goal", "huge"):
            assert [t["metadata"]["uid"] for t in trials(experiments_api, namespace, name)] == before[name]
            body = get_experiment(experiments_api, namespace, name)
            assert body["status"]["phase"] == ("Succeeded" if name == "goal" else "Failed")

    # a spec change that lifts the limit reopens it: more trials for a MaxTrialsReached run
    create(experiments_api, namespace, experiment("more", budget={"maxTrials": 1}, trial=QUICK))
    wait_condition(experiments_api, namespace, "more", "Succeeded", timeout=180, operator=operator)
    operator.kill()
    patch_spec(experiments_api, namespace, "more", {"budget": {"maxTrials": 2}})
    operator.start()
    done = wait_for(lambda: (body := get_experiment(experiments_api, namespace, "more"))["status"].get(
        "trialCounts", {}).get("succeeded") == 2 and condition_met(body, "Succeeded") and body,
        timeout=180, message="the reopened run to finish its second trial")
    assert len(trials(experiments_api, namespace, "more")) == 2
    assert condition(done, "Succeeded")["observedGeneration"] == done["metadata"]["generation"]


def test_recreated_experiment_never_adopts_the_old_ones_trials(operator, experiments_api, namespace, kube_cluster):
    old = create(experiments_api, namespace, experiment(
        "again", search_space={"x": {"choice": [1.0]}, "y": {"choice": [0.0]}}, search={"algorithm": "grid"},
        budget={"maxTrials": 1}, trial=QUICK))
    wait_condition(experiments_api, namespace, "again", "Succeeded", timeout=180, operator=operator)
    [stale] = trials(experiments_api, namespace, "again")
    # the garbage collector's lag, made long: the old Trial stays while a finalizer holds it
    experiments_api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trials", stale["metadata"]["name"],
                                                   {"metadata": {"finalizers": ["test.kubetune.dev/hold"]}})
    experiments_api.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "again")
    wait_for(lambda: experiment_gone(experiments_api, namespace, "again"), timeout=90, message="old one gone")

    # kubectl apply of the same name, other parameters
    new = create(experiments_api, namespace, experiment(
        "again", search_space={"x": {"choice": [2.0]}, "y": {"choice": [0.0]}}, search={"algorithm": "grid"},
        budget={"maxTrials": 1}, trial=QUICK))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    wait_for(lambda: any(e.reason == "WaitingForEarlierTrial" for e in events(kube_cluster, namespace, "again")),
             timeout=90, message="the new run to wait for the old Trial")
    body = get_experiment(experiments_api, namespace, "again")
    # nothing of the old run shows: not its phase, not its count
    assert (body.get("status") or {}).get("trialCounts", {}).get("succeeded", 0) == 0
    experiments_api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trials", stale["metadata"]["name"],
                                                   {"metadata": {"finalizers": None}})
    done = wait_condition(experiments_api, namespace, "again", "Succeeded", timeout=180, operator=operator)
    [trial] = trials(experiments_api, namespace, "again")
    assert trial["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]
    assert trial["spec"]["parameters"] == {"x": 2.0, "y": 0.0}
    assert len(trial["status"]["history"]) == 3
    assert done["status"]["bestTrial"]["parameters"] == {"x": 2.0, "y": 0.0}


def test_conditions_describe_the_current_generation(operator, experiments_api, namespace):
    # an invalid spec fails; fixed, it runs, and Failed no longer says True
    # (passes the CRD schema; grid search has no grid for a uniform range)
    create(experiments_api, namespace, experiment("fixme", search={"algorithm": "grid"},
                                                  budget={"maxTrials": 1}, trial=QUICK))
    wait_condition(experiments_api, namespace, "fixme", "Failed", timeout=90, operator=operator)
    patch_spec(experiments_api, namespace, "fixme", {"search": {"algorithm": "random"},
                                                     "trial": {"config": {"iterations": 30, "delay": 0.1}}})
    running = wait_condition(experiments_api, namespace, "fixme", "Running", timeout=180, operator=operator)
    assert running["status"]["phase"] == "Running" and not condition_met(running, "Failed")
    done = wait_condition(experiments_api, namespace, "fixme", "Succeeded", timeout=180, operator=operator)
    assert condition(done, "Failed")["status"] == "False"
    assert done["status"]["observedGeneration"] == done["metadata"]["generation"] == 2

    # a finished run resumed by raising maxTrials: Succeeded and completionTime go while it runs
    create(experiments_api, namespace, experiment(
        "resume", budget={"maxTrials": 1, "parallelism": 1}, trial={"config": {"iterations": 3}}))
    first = wait_condition(experiments_api, namespace, "resume", "Succeeded", timeout=180, operator=operator)
    assert "completionTime" in first["status"]
    patch_spec(experiments_api, namespace, "resume",
               {"budget": {"maxTrials": 3}, "trial": {"config": {"iterations": 40, "delay": 0.1}}})
    running = wait_for(lambda: (body := get_experiment(experiments_api, namespace, "resume"))["status"].get(
        "trialCounts", {}).get("running") and body, timeout=180, message="the resumed run's trial running")
    assert running["status"]["phase"] == "Running"
    assert "completionTime" not in running["status"]
    assert not condition_met(running, "Succeeded")       # kubectl wait does not return
    assert condition(running, "Succeeded")["status"] == "False"
    assert condition(running, "Running")["status"] == "True"
    # every condition speaks of this generation (Argo CD / Flux read observedGeneration)
    assert {c["observedGeneration"] for c in running["status"]["conditions"]} == {running["metadata"]["generation"]}
    done = wait_condition(experiments_api, namespace, "resume", "Succeeded", timeout=120, operator=operator)
    assert done["status"]["trialCounts"]["succeeded"] == 3 and "completionTime" in done["status"]


@pytest.mark.parametrize("allowed", [False, True])
def test_local_ray_inside_a_cluster_needs_the_operators_consent(kube_cluster, experiments_api, namespace,
                                                                tmp_path, allowed):
    # the kubelet sets KUBERNETES_SERVICE_HOST in every pod; the API is still reached via KUBECONFIG
    args = ("--allow-local-ray",) if allowed else ()
    operator = OperatorWithEnv(kube_cluster.kubeconfig, "local", tmp_path, namespace, extra_args=args,
                               env={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    operator.start()
    try:
        create(experiments_api, namespace, experiment("inside", budget={"maxTrials": 1},
                                                      trial={"resources": {"cpu": 0.5}, **QUICK}))
        if allowed:
            wait_condition(experiments_api, namespace, "inside", "Succeeded", timeout=120, operator=operator)
        else:
            failed = wait_condition(experiments_api, namespace, "inside", "Failed", timeout=90, operator=operator)
            assert "--allow-local-ray" in condition(failed, "Failed")["message"]
            assert trials(experiments_api, namespace, "inside") == []
    finally:
        operator.stop()

