"""The pure parts of the pod executor: rendering a trial's Pod, reading a Pod back,
the result inbox (seq, attempts, stop), the Queued overlay and the spec checks."""
import copy
import json

import pytest

from kubetune.controller.platform_queue import PlatformQueue
from kubetune.core.types import ExperimentSummary, TrialPhase
from kubetune.executors.pods import spec as pod_spec
from kubetune.executors.pods.ingest import ResultInbox, _validate
from kubetune.spec import SpecError, TrialResources, parse_experiment

TEMPLATE = {"metadata": {"labels": {"app": "trainer"}, "annotations": {"team": "ml"}},
            "spec": {"containers": [{"name": "train", "image": "trainer:1", "command": ["python", "train.py"],
                                     "args": ["--lr=${params.lr}", "--note", "${params.note}"],
                                     "env": [{"name": "USER_VAR", "value": "1"}]},
                                    {"name": "sidecar", "image": "logger:1"}],
                     "restartPolicy": "OnFailure"}}


def render(**overrides):
    options = dict(namespace="ns", experiment="exp", trial="exp-3", trial_uid="uid-3", attempt=2,
                   params={"lr": 0.01, "note": "; rm -rf / $(HOME)", "flag": True},
                   env={"KUBETUNE_INGEST_URL": "http://op:8081"},
                   resources=TrialResources(cpu=2, gpu=1, memory=2**30))
    options.update(overrides)
    return pod_spec.render_pod(TEMPLATE, **options)


def test_a_trial_pod_is_named_owned_and_labelled_after_its_trial():
    pod = render()
    meta = pod["metadata"]
    assert meta["name"] == "exp-3-a2"
    assert meta["ownerReferences"] == [{"apiVersion": "kubetune.dev/v1alpha1", "kind": "Trial", "name": "exp-3",
                                        "uid": "uid-3", "controller": True, "blockOwnerDeletion": True}]
    assert meta["labels"] == {"app": "trainer", "kubetune.dev/experiment": "exp", "kubetune.dev/trial": "exp-3",
                              "kubetune.dev/attempt": "2"}
    assert meta["annotations"] == {"team": "ml", "kubetune.dev/trial-key": "ns/exp/exp-3"}
    assert pod["spec"]["restartPolicy"] == "Never"
    assert TEMPLATE["spec"]["restartPolicy"] == "OnFailure"     # the template itself is untouched


def test_values_are_single_arguments_protected_from_kubernetes_expansion():
    train = render()["spec"]["containers"][0]
    assert train["command"] == ["python", "train.py"]
    # "$" doubled: the kubelet turns "$$" back into "$", so the container sees the value verbatim
    assert train["args"] == ["--lr=0.01", "--note", "; rm -rf / $$(HOME)"]
    env = {e["name"]: e for e in train["env"]}
    assert env["KUBETUNE_PARAM_NOTE"]["value"] == "; rm -rf / $$(HOME)"
    assert env["KUBETUNE_PARAM_LR"]["value"] == "0.01" and env["KUBETUNE_PARAM_FLAG"]["value"] == "true"
    assert env["KUBETUNE_TRIAL_TOKEN"] == {"name": "KUBETUNE_TRIAL_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "exp-3-token", "key": "token"}}}
    assert env["USER_VAR"]["value"] == "1"


def test_every_container_gets_the_config_file_and_only_the_first_the_trial_resources():
    train, sidecar = render()["spec"]["containers"]
    for container in (train, sidecar):
        assert {"name": "kubetune-config", "mountPath": "/etc/kubetune", "readOnly": True} in container["volumeMounts"]
    assert train["resources"] == {"requests": {"cpu": "2", "memory": str(2**30), "nvidia.com/gpu": "1"},
                                  "limits": {"memory": str(2**30), "nvidia.com/gpu": "1"}}
    assert "resources" not in sidecar
    volumes = render()["spec"]["volumes"]
    assert volumes == [{"name": "kubetune-config", "configMap": {"name": "exp-3-params"}}]
    own = copy.deepcopy(TEMPLATE)
    own["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    assert pod_spec.render_pod(own, namespace="ns", experiment="exp", trial="exp-3", trial_uid="u", attempt=0,
                               params={"lr": 1, "note": ""}, env={},
                               resources=TrialResources(gpu=1))["spec"]["containers"][0]["resources"] == \
        {"limits": {"nvidia.com/gpu": "4"}}


def test_the_config_map_holds_the_whole_config_as_json():
    body = pod_spec.config_map_body("ns", "exp", "exp-3", "uid", {"lr": 0.1, "epochs": 3})
    assert json.loads(body["data"]["config.json"]) == {"lr": 0.1, "epochs": 3}
    assert body["metadata"]["ownerReferences"][0]["name"] == "exp-3"


def test_an_unknown_parameter_reference_names_the_element():
    with pytest.raises(pod_spec.PodSpecError, match=r"containers\[0\]\.args: \$\{params\.nope\}"):
        pod_spec.substitute("${params.nope}", {"lr": 1}, "spec.trial.template.spec.containers[0].args")


def pod(phase, **status):
    return {"metadata": {"name": "p"}, "spec": {}, "status": {"phase": phase, **status}}


def test_reading_a_pod_back():
    waiting = pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}])
    assert pod_spec.unschedulable(waiting) == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    assert pod_spec.unschedulable(pod("Pending")) is None
    oom = pod("Failed", containerStatuses=[{"name": "train", "state": {"terminated": {
        "exitCode": 137, "reason": "OOMKilled"}}}])
    assert pod_spec.failure(oom) == ("container train exited with code 137 (OOMKilled)", False)
    evicted = pod("Failed", reason="Evicted", message="The node was low on resource: memory.")
    text, cluster_fault = pod_spec.failure(evicted)
    assert cluster_fault and text == "pod Evicted: The node was low on resource: memory."


def result(seq, iteration=1, attempt=0, **extra):
    return {"seq": seq, "iteration": iteration, "metrics": {"loss": seq}, "attempt": attempt, **extra}


def test_the_inbox_counts_each_seq_once_and_refuses_replaced_attempts_and_stopped_trials():
    inbox = ResultInbox()
    inbox.open("ns/exp/exp-0", "token", attempt=1, after_seq=4)
    assert inbox.offer("ns", "exp-0", result(4, attempt=1)) == (200, {"accepted": False, "duplicate": True})
    assert inbox.offer("ns", "exp-0", result(5, attempt=1, checkpoint="/c/5"))[1] == {"accepted": True}
    assert inbox.offer("ns", "exp-0", result(5, attempt=1))[1]["duplicate"]
    assert inbox.offer("ns", "exp-0", result(6, attempt=0))[0] == 409
    assert inbox.offer("ns", "exp-0", result(6, attempt=1))[0] == 200
    assert [r.seq for r in inbox.take("ns/exp/exp-0", after_seq=4)] == [5, 6]
    assert [r.seq for r in inbox.take("ns/exp/exp-0", after_seq=5)] == [6]
    assert inbox.offer("ns", "exp-0", result(5, attempt=1))[1]["duplicate"]   # already taken
    assert inbox.latest("ns/exp/exp-0") == ("/c/5", 1)
    inbox.stop("ns/exp/exp-0")
    assert inbox.offer("ns", "exp-0", result(7, attempt=1)) == (410, {"stop": True, "error": "the trial was stopped"})
    assert inbox.offer("ns", "exp-9", result(0))[0] == 404


def test_malformed_results_are_named():
    assert _validate([]) == "the body must be a JSON object"
    assert _validate({"seq": -1, "iteration": 1, "metrics": {}}).startswith("seq")
    assert _validate({"seq": 0, "iteration": 0, "metrics": {}}).startswith("iteration")
    assert _validate({"seq": 0, "iteration": 1, "metrics": []}).startswith("metrics")
    assert _validate({"seq": 0, "iteration": 1, "metrics": {}, "checkpoint": 3}).startswith("checkpoint")
    assert _validate({"seq": 0, "iteration": 1, "metrics": {}}) == ""


class FakeTrial:
    def __init__(self, phase):
        self.phase = phase


def test_launched_trials_the_scheduler_cannot_place_show_as_queued():
    queue = PlatformQueue()
    assert queue.note("a", "Unschedulable", "0/2 nodes are available")
    assert not queue.note("a", "Unschedulable", "0/2 nodes are available")
    running = {"phase": "Running", "reason": "", "message": "", "iteration": 0}
    assert queue.trial_status("a", running) == {**running, "phase": "Queued", "reason": "Unschedulable",
                                                "message": "0/2 nodes are available", "launched": True}
    assert queue.trial_status("b", running) == running
    assert queue.trial_status("a", {**running, "phase": "Stopped"})["phase"] == "Stopped"
    summary = ExperimentSummary(counts={"Running": 3, "Queued": 0})
    trials = {"a": FakeTrial(TrialPhase.RUNNING), "b": FakeTrial(TrialPhase.RUNNING)}
    adjusted = queue.summary(summary, trials)
    assert adjusted.counts == {"Running": 2, "Queued": 1} and adjusted.queue_reason == "0/2 nodes are available"
    assert queue.note("a", "", "")      # it started
    assert queue.summary(summary, trials) is summary


POD_SPEC = {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"lr": {"uniform": [0, 1]}},
            "executor": "pod", "trial": {"resources": {"gpu": 1}, "config": {"epochs": 2}, "template": {
                "spec": {"containers": [{"name": "t", "image": "i", "args": ["${params.lr}", "${params.epochs}"]}]}}}}


def test_the_pod_executor_spec():
    spec = parse_experiment(POD_SPEC)
    assert spec.executor == "pod" and spec.trial.entrypoint is None
    assert spec.trial.template["spec"]["containers"][0]["image"] == "i"

    def error(change):
        body = copy.deepcopy(POD_SPEC)
        change(body)
        with pytest.raises(SpecError) as caught:
            parse_experiment(body)
        return str(caught.value)

    assert error(lambda b: b["trial"]["template"]["spec"]["containers"][0]["args"].append("${params.lr2}")) \
        .startswith("spec.trial.template.spec.containers[0].args[2]: ${params.lr2} names no parameter")
    assert error(lambda b: b["trial"].pop("template")).startswith("spec.trial.template: ")
    assert error(lambda b: b["trial"]["template"]["spec"].update(containers=[])).startswith(
        "spec.trial.template.spec.containers: required")
    assert error(lambda b: b["trial"]["resources"].update(gpu=0.5)).startswith("spec.trial.resources.gpu")
    assert error(lambda b: b["trial"]["resources"].update(bundles=2)).startswith("spec.trial.resources.bundles")
    assert error(lambda b: b.update(executor="ray", trial={**b["trial"], "entrypoint": "a:b"})).startswith(
        "spec.trial.template: only the pod executor")
