"""The operator loop end to end: real kube-apiserver, real Ray, the operator process."""
from __future__ import annotations

import time

import pytest

from k8s_helpers import condition, create, experiment, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.controller.conditions import parse_rfc3339
from kubetune.examples.quadratic import bowl

pytestmark = pytest.mark.integration


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                   key=lambda edge: (edge[0], edge[1]))
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_twenty_gpu_trials_with_parallelism_four(operator, experiments_api, namespace, kube_cluster):
    body = experiment("bowl", budget={"maxTrials": 20, "parallelism": 4},
                      trial={"resources": {"cpu": 0.1, "gpu": 1}, "config": {"iterations": 4, "delay": 0.05}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "bowl", "Succeeded", timeout=240, operator=operator)

    items = trials(experiments_api, namespace, "bowl")
    assert [t["metadata"]["name"] for t in items] == [f"bowl-{i}" for i in range(20)]
    for trial in items:
        x, y = trial["spec"]["parameters"]["x"], trial["spec"]["parameters"]["y"]
        expected = [bowl(x, y) + 1.0 / step for step in range(1, 5)]
        history = [entry["val_loss"] for entry in trial["status"]["history"]]
        assert history == pytest.approx(expected, rel=1e-12), trial["metadata"]["name"]
        assert trial["status"]["phase"] == "Succeeded"
        assert trial["metadata"]["ownerReferences"][0]["name"] == "bowl"

    true_best = min(items, key=lambda t: min(e["val_loss"] for e in t["status"]["history"]))
    best = done["status"]["bestTrial"]
    assert best["name"] == true_best["metadata"]["name"]
    assert best["metric"] == pytest.approx(min(e["val_loss"] for e in true_best["status"]["history"]))
    assert best["parameters"] == true_best["spec"]["parameters"]
    assert done["status"]["trialCounts"]["succeeded"] == 20
    assert done["status"]["progress"] == "20/20"
    assert condition(done, "Succeeded")["reason"] == "MaxTrialsReached"

    def event_reasons():
        import kubernetes
        with kube_cluster.api_client() as client:
            events = kubernetes.client.CoreV1Api(client).list_namespaced_event(
                namespace, field_selector="involvedObject.name=bowl").items
        return {event.reason for event in events}
    wait_for(lambda: {"TrialLaunched", "MaxTrialsReached"} <= event_reasons(), timeout=30,
             message="Events on the Experiment for launches and completion")

    intervals = [(parse_rfc3339(t["status"]["startTime"]), parse_rfc3339(t["status"]["completionTime"]))
                 for t in items]
    assert max_overlap(intervals) <= 4

    # finished Trials lose the API server's record of field managers (issue 26: two
    # thirds of what `kubectl get trials` reads); the strip follows the final status write
    wait_for(lambda: not [t["metadata"]["name"] for t in trials(experiments_api, namespace, "bowl")
                          if t["metadata"].get("managedFields")],
             timeout=30, message="every finished Trial's managedFields stripped")


def test_invalid_spec_is_reported_not_retried(operator, experiments_api, namespace):
    # passes the CRD schema, fails the semantic check: grid search has no grid for a uniform range
    body = experiment("bad", search={"algorithm": "grid"})
    create(experiments_api, namespace, body)
    failed = wait_condition(experiments_api, namespace, "bad", "Failed", timeout=60, operator=operator)
    reason = condition(failed, "Failed")
    assert reason["reason"] == "InvalidSpec"
    assert "spec.searchSpace.x" in reason["message"]
    assert failed["status"]["observedGeneration"] == failed["metadata"]["generation"]
    assert trials(experiments_api, namespace, "bad") == []


def test_search_algorithm_auto_names_the_sampler_it_chose(operator, experiments_api, namespace):
    body = experiment("auto", search={"algorithm": "auto", "seed": 3}, budget={"maxTrials": 3, "parallelism": 3},
                      trial={"config": {"iterations": 2, "delay": 0.0}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "auto", "Succeeded", timeout=120, operator=operator)
    chosen = condition(done, "SearchChosen")
    assert (chosen["status"], chosen["reason"]) == ("True", "Auto")
    assert chosen["message"] == "search.algorithm auto chose tpe: one objective and 3 trials"
    assert done["spec"]["search"]["algorithm"] == "auto"        # the spec keeps what the user wrote


def test_failing_trial_is_failed_with_traceback_and_experiment_goes_on(operator, experiments_api, namespace):
    body = experiment("flaky", entrypoint="kubetune.examples.flaky:train",
                      search_space={"fail_at": {"choice": [0, 2]}},
                      search={"algorithm": "grid"}, budget={"maxTrials": 2, "parallelism": 2},
                      trial={"config": {"iterations": 3}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "flaky", "Succeeded", timeout=120, operator=operator)
    by_fail_at = {t["spec"]["parameters"]["fail_at"]: t for t in trials(experiments_api, namespace, "flaky")}
    failed, fine = by_fail_at[2], by_fail_at[0]
    assert failed["status"]["phase"] == "Failed"
    assert "RuntimeError: flaky failure after iteration 2" in failed["status"]["message"]
    assert "Traceback" in failed["status"]["message"]
    assert [h["score"] for h in failed["status"]["history"]] == [1, 2]
    assert fine["status"]["phase"] == "Succeeded"
    assert [h["score"] for h in fine["status"]["history"]] == [1, 2, 3]
    assert done["status"]["trialCounts"]["failed"] == 1


def test_deleting_an_experiment_stops_its_actors_and_removes_trials(operator, experiments_api, namespace, ray_local):
    import ray

    body = experiment("doomed", entrypoint="kubetune.examples.sleepy:train",
                      budget={"maxTrials": 2, "parallelism": 2}, trial={"config": {"iterations": 100000, "interval": 0.1}})
    create(experiments_api, namespace, body)
    wait_for(lambda: [t for t in trials(experiments_api, namespace, "doomed")
                      if (t.get("status") or {}).get("phase") == "Running"].__len__() == 2,
             timeout=90, message="both trials running")
    # a running Trial keeps its managedFields: who created it, who writes its status
    for trial in trials(experiments_api, namespace, "doomed"):
        if trial["status"]["phase"] == "Running":
            assert {f.get("subresource", "") for f in trial["metadata"]["managedFields"]} == {"", "status"}
    if not ray.is_initialized():
        ray.init(address=ray_local, namespace="kubetune", log_to_driver=False)
    prefix = f"kubetune/{namespace}/doomed/"

    def live_actors():
        return [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    assert live_actors()
    experiments_api.delete_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", "doomed")
    deleted_at = time.monotonic()
    wait_for(lambda: not live_actors(), timeout=10, message="the trials' Ray actors to be gone")
    assert time.monotonic() - deleted_at < 10
    wait_for(lambda: trials(experiments_api, namespace, "doomed") == [], timeout=60,
             message="Trials garbage-collected")


def test_sigterm_ends_the_operator_with_exit_code_0_and_its_running_trial_goes_on(operator, experiments_api,
                                                                                   namespace):
    """The kubelet stops the operator's pod with SIGTERM: kopf's shutdown runs, and the
    process exits 0.  Ray's failure-signal handler took that SIGTERM for a crash (a stack
    trace in the log, then SIGABRT: exit code 134, a failed container).  The trial it was
    driving runs on, and the next operator re-attaches to it: one attempt, a whole history."""
    import signal
    create(experiments_api, namespace, experiment("calm", budget={"maxTrials": 1, "parallelism": 1},
                                                  trial={"config": {"iterations": 40, "delay": 0.2}}))
    wait_for(lambda: any(len((t.get("status") or {}).get("history") or ()) >= 2
                         for t in trials(experiments_api, namespace, "calm")),
             timeout=120, message="the trial running and reporting")
    operator.process.send_signal(signal.SIGTERM)
    code = operator.process.wait(60)
    log = operator.log()
    assert code == 0, log[-5000:]
    assert "SIGTERM received" not in log, log[-5000:]      # Ray's crash report
    operator.start()
    wait_condition(experiments_api, namespace, "calm", "Succeeded", timeout=180, operator=operator)
    (trial,) = trials(experiments_api, namespace, "calm")
    assert trial["status"]["attempt"] == 0 and not trial["status"].get("failures"), trial["status"]
    assert (trial["status"]["iteration"], trial["status"]["lastResultSeq"]) == (40, 39), trial["status"]
