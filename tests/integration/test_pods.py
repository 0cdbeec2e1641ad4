"""Trials as pods (spec.executor: pod): the operator process, a real API server with the
kube-scheduler, and kwok's fake GPU nodes.  The test plays each trial's container: it
reads what the pod would see (env, the token from the trial's Secret, the config file
from its ConfigMap), posts results with kubetune's own trial-side session, and ends
the pod through kwok (pod_fixtures / kubetune.devcluster.kwok)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from k8s_helpers import GROUP, VERSION, condition, create, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.devcluster.kwok import EXIT_ANNOTATION, REASON_ANNOTATION
from kubetune.trainable.api import TrialStopped
from kubetune.trainable.pod_session import PodSession

pytestmark = pytest.mark.integration


def bowl(lr: float, iteration: int) -> float:
    return (lr - 0.3) ** 2 + 1.0 / iteration


def pod_experiment(name: str, *, search_space: dict | None = None, args: list[str] | None = None,
                   **spec) -> dict:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": name},
        "spec": {
            "executor": "pod",
            "objective": {"metric": "loss", "mode": "min"},
            "searchSpace": search_space or {"lr": {"uniform": [0.0, 1.0]}},
            "search": {"algorithm": "random", "seed": 3},
            "trial": {
                "resources": {"cpu": 1, "gpu": 1},
                "template": {"metadata": {"labels": {"app": "trainer"}},
                             "spec": {"containers": [{"name": "train", "image": "example.com/trainer:1",
                                                      "command": ["python", "-m", "train"],
                                                      "args": args or ["--lr", "${params.lr}"]}]}},
            },
        },
    }
    for key, value in spec.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return body


class Container:
    """One trial pod's container, as the test plays it."""

    def __init__(self, core: client.CoreV1Api, pod: client.V1Pod, workdir: Path) -> None:
        self.core = core
        self.pod = pod
        self.name, self.namespace = pod.metadata.name, pod.metadata.namespace
        spec = pod.spec.containers[0]
        self.args = list(spec.args or [])
        self.env = {e.name: e.value for e in spec.env if e.value is not None}
        token_ref = next(e.value_from.secret_key_ref for e in spec.env if e.name == "KUBETUNE_TRIAL_TOKEN")
        secret = core.read_namespaced_secret(token_ref.name, self.namespace)
        import base64
        self.token = base64.b64decode(secret.data[token_ref.key]).decode()
        volume = next(v for v in pod.spec.volumes if v.name == "kubetune-config")
        config_map = core.read_namespaced_config_map(volume.config_map.name, self.namespace)
        config_file = workdir / f"{self.name}-config.json"
        config_file.write_text(config_map.data["config.json"])
        self.session = PodSession({**self.env, "KUBETUNE_TRIAL_TOKEN": self.token,
                                   "KUBETUNE_CONFIG_FILE": str(config_file), "KUBETUNE_REPORT_TIMEOUT": "60"})
        self.trial = self.env["KUBETUNE_TRIAL"].rsplit("/", 1)[1]

    def post(self, body: dict, token: str | None, trial: str | None = None) -> tuple[int, dict]:
        """A raw POST to the ingest endpoint (for what the session would never send)."""
        url = f"{self.env['KUBETUNE_INGEST_URL']}/v1/results/{self.namespace}/{trial or self.trial}"
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def exit(self, code: int, reason: str | None = None) -> None:
        annotations = {EXIT_ANNOTATION: str(code)}
        if reason:
            annotations[REASON_ANNOTATION] = reason
        self.core.patch_namespaced_pod(self.name, self.namespace, {"metadata": {"annotations": annotations}})


def pods_of(core: client.CoreV1Api, namespace: str, experiment: str) -> list[client.V1Pod]:
    return core.list_namespaced_pod(namespace, label_selector=f"kubetune.dev/experiment={experiment}").items


def unschedulable_message(pod: client.V1Pod) -> str | None:
    for item in pod.status.conditions or []:
        if item.type == "PodScheduled" and item.status == "False" and item.reason == "Unschedulable":
            return item.message
    return None


@pytest.fixture(scope="module")
def core(gpu_cluster):
    with gpu_cluster.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture(scope="module")
def custom(gpu_cluster):
    with gpu_cluster.api_client() as api:
        yield client.CustomObjectsApi(api)


def test_six_gpu_trials_on_two_nodes_queue_in_the_scheduler(pod_operator, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, pod_experiment("six", budget={"maxTrials": 6, "parallelism": 6}))

    def four_running_two_unschedulable():
        pods = pods_of(core, ns, "six")
        running = [p for p in pods if p.status.phase == "Running"]
        waiting = [p for p in pods if unschedulable_message(p)]
        return (running, waiting) if len(pods) == 6 and len(running) == 4 and len(waiting) == 2 else None

    running, waiting = wait_for(four_running_two_unschedulable, timeout=60, interval=0.2,
                                message="4 running and 2 unschedulable pods")
    assert {p.spec.node_name for p in running} == {"gpu-0", "gpu-1"}

    def trials_queued():
        items = trials(custom, ns, "six")
        phases = sorted(t.get("status", {}).get("phase", "") for t in items)
        return items if phases == ["Queued"] * 2 + ["Running"] * 4 else None

    items = wait_for(trials_queued, timeout=30, interval=0.2, message="4 Running and 2 Queued Trials")
    for trial in items:
        if trial["status"]["phase"] == "Queued":
            assert trial["status"]["reason"] == "Unschedulable"
            assert "Insufficient nvidia.com/gpu" in trial["status"]["message"], trial["status"]

    # the cluster autoscaler's word on a pending pod joins the scheduler's on its Trial
    pending = waiting[0]
    core.create_namespaced_event(ns, {
        "metadata": {"generateName": f"{pending.metadata.name}."},
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": pending.metadata.name, "uid": pending.metadata.uid},
        "reason": "TriggeredScaleUp", "type": "Normal", "source": {"component": "cluster-autoscaler"},
        "message": "pod triggered scale-up: [{gpu-pool 2->3 (max: 4)}]"})
    trial_of_pending = pending.metadata.owner_references[0].name
    wait_for(lambda: "cluster-autoscaler TriggeredScaleUp: pod triggered scale-up" in (custom.get_namespaced_custom_object(
        GROUP, VERSION, ns, "trials", trial_of_pending).get("status") or {}).get("message", ""),
        timeout=15, interval=0.2, message="the autoscaler's event on the Queued Trial")

    status = wait_for(lambda: (lambda s: s if s.get("trialCounts", {}).get("queued") == 2 else None)(
        get_experiment(custom, ns, "six").get("status") or {}), timeout=15, message="queued count on the Experiment")
    assert status["trialCounts"]["running"] == 4
    assert "Insufficient nvidia.com/gpu" in status["queueReason"]

    # play the containers: whichever pods run report three results each and exit 0
    played: set[str] = set()
    while len(played) < 6:
        fresh = wait_for(lambda: [p for p in pods_of(core, ns, "six")
                                  if p.status.phase == "Running" and p.metadata.name not in played],
                         timeout=60, interval=0.2, message=f"more running pods (played {sorted(played)})")
        for pod in fresh:
            container = Container(core, pod, tmp_path)
            lr = container.session.get_config()["lr"]
            assert container.args == ["--lr", json.dumps(lr)]
            assert float(container.env["KUBETUNE_PARAM_LR"]) == lr
            for iteration in (1, 2, 3):
                container.session.report({"loss": bowl(lr, iteration)})
            # a retried POST (lost answer) carries the same seq: accepted once only
            again = {"seq": 1, "iteration": 2, "metrics": {"loss": -100.0}, "attempt": 0}
            assert container.post(again, container.token) == (200, {"accepted": False, "duplicate": True})
            container.exit(0)
            played.add(pod.metadata.name)

    done = wait_condition(custom, ns, "six", "Succeeded", timeout=60, operator=pod_operator)
    items = trials(custom, ns, "six")
    assert [t["status"]["phase"] for t in items] == ["Succeeded"] * 6
    for trial in items:
        lr = trial["spec"]["parameters"]["lr"]
        assert [h["loss"] for h in trial["status"]["history"]] == pytest.approx([bowl(lr, i) for i in (1, 2, 3)])
    best = min(items, key=lambda t: t["status"]["bestMetric"])
    assert done["status"]["bestTrial"]["name"] == best["metadata"]["name"]
    assert done["status"]["bestTrial"]["metric"] == pytest.approx(bowl(best["spec"]["parameters"]["lr"], 3))
    assert condition(done, "Succeeded")["reason"] == "MaxTrialsReached"
    pod = pods_of(core, ns, "six")[0]
    assert pod.metadata.owner_references[0].kind == "Trial"
    assert pod.metadata.labels["app"] == "trainer" and pod.spec.restart_policy == "Never"
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"


def test_a_result_with_another_trials_token_is_refused(pod_operator, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, pod_experiment("tokens", budget={"maxTrials": 2, "parallelism": 2},
                                      trial={"resources": {"cpu": 0.1}}))
    pods = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
        pods_of(core, ns, "tokens")), timeout=60, interval=0.2, message="two running pods")
    first, second = sorted((Container(core, pod, tmp_path) for pod in pods), key=lambda c: c.trial)
    assert first.token != second.token
    assert all(e.value is None for e in pods[0].spec.containers[0].env if e.name == "KUBETUNE_TRIAL_TOKEN")

    forged = {"seq": 0, "iteration": 1, "metrics": {"loss": -1000.0}}
    assert first.post(forged, first.token, trial=second.trial)[0] == 403
    assert first.post(forged, None, trial=second.trial)[0] == 403
    assert first.post(forged, "not-a-token", trial=second.trial)[0] == 403

    second.session.report({"loss": 0.5})
    first.session.report({"loss": 0.7})
    first.exit(0)
    second.exit(0)
    done = wait_condition(custom, ns, "tokens", "Succeeded", timeout=60, operator=pod_operator)
    by_name = {t["metadata"]["name"]: t for t in trials(custom, ns, "tokens")}
    assert [h["loss"] for h in by_name[second.trial]["status"]["history"]] == [0.5]
    assert [h["loss"] for h in by_name[first.trial]["status"]["history"]] == [0.7]
    assert done["status"]["bestTrial"]["metric"] == 0.5


def test_a_hyperparameter_reaches_the_container_verbatim_as_one_argument(pod_operator, core, custom, pod_namespace,
                                                                         tmp_path):
    ns = pod_namespace
    hostile = "; rm -rf /"
    create(custom, ns, pod_experiment(
        "verbatim", budget={"maxTrials": 1}, trial={"resources": {"cpu": 0.1}},
        search_space={"note": {"choice": [hostile]}, "lr": {"choice": [0.25]}},
        args=["--note", "${params.note}", "--lr=${params.lr}"]))
    pod = wait_for(lambda: next((p for p in pods_of(core, ns, "verbatim") if p.status.phase == "Running"), None),
                   timeout=60, interval=0.2, message="the trial's pod")
    container = Container(core, pod, tmp_path)
    assert pod.spec.containers[0].command == ["python", "-m", "train"]
    assert container.args == ["--note", hostile, "--lr=0.25"]
    assert container.env["KUBETUNE_PARAM_NOTE"] == hostile
    assert container.session.get_config() == {"note": hostile, "lr": 0.25}
    container.session.report({"loss": 1.0})
    container.exit(0)
    wait_condition(custom, ns, "verbatim", "Succeeded", timeout=60, operator=pod_operator)

    # a reference to a parameter that does not exist is the user's error, shown on the Experiment
    create(custom, ns, pod_experiment("typo", args=["--lr", "${params.learning_rate}"]))
    failed = wait_condition(custom, ns, "typo", "Failed", timeout=30, operator=pod_operator)
    assert condition(failed, "Failed")["reason"] == "InvalidSpec"
    assert "spec.trial.template.spec.containers[0].args[1]" in failed["status"]["message"]
    assert "${params.learning_rate}" in failed["status"]["message"]


def test_a_failed_pod_is_replaced_from_its_checkpoint(pod_operator, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, pod_experiment("retry", budget={"maxTrials": 1}, trial={"maxFailures": 1}))
    pod = wait_for(lambda: next((p for p in pods_of(core, ns, "retry") if p.status.phase == "Running"), None),
                   timeout=60, interval=0.2, message="the first attempt's pod")
    assert pod.metadata.name == "retry-0-a0"
    first = Container(core, pod, tmp_path)
    saved = tmp_path / "weights"
    saved.mkdir()
    (saved / "model.txt").write_text("step 1")
    first.session.report({"loss": 0.9}, checkpoint=str(saved))
    first.exit(137, "OOMKilled")

    replacement = wait_for(lambda: next((p for p in pods_of(core, ns, "retry")
                                         if p.metadata.name == "retry-0-a1" and p.status.phase == "Running"), None),
                           timeout=60, interval=0.2, message="the second attempt's pod")
    second = Container(core, replacement, tmp_path)
    assert second.env["KUBETUNE_ATTEMPT"] == "1"
    assert second.env["KUBETUNE_START_ITERATION"] == "1" and second.env["KUBETUNE_FIRST_SEQ"] == "1"
    assert (Path(second.session.get_checkpoint()) / "model.txt").read_text() == "step 1"
    trial = wait_for(lambda: (lambda t: t if t["status"].get("attempt") == 1 else None)(
        custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trials", "retry-0")),
        timeout=15, message="attempt 1 on the Trial")   # a write coalesced for up to 2 s
    assert "exited with code 137 (OOMKilled)" in trial["status"]["failures"][0]["message"]
    with pytest.raises(TrialStopped):   # the replaced attempt may not report any more
        first.session.report({"loss": 0.1})

    second.session.report({"loss": 0.4})
    second.exit(0)
    wait_condition(custom, ns, "retry", "Succeeded", timeout=60, operator=pod_operator)
    history = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trials", "retry-0")["status"]["history"]
    assert [(h["iteration"], h["loss"]) for h in history] == [(1, 0.9), (2, 0.4)]


def test_a_stop_decision_deletes_the_running_pod(pod_operator, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, pod_experiment("capped", budget={"maxTrials": 1}, scheduler={"maxIterations": 2}))
    pod = wait_for(lambda: next((p for p in pods_of(core, ns, "capped") if p.status.phase == "Running"), None),
                   timeout=60, interval=0.2, message="the trial's pod")
    container = Container(core, pod, tmp_path)
    container.session.report({"loss": 0.8})
    container.session.report({"loss": 0.6})      # maxIterations reached: the trial is done, its pod goes
    wait_condition(custom, ns, "capped", "Succeeded", timeout=30, operator=pod_operator)
    wait_for(lambda: not pods_of(core, ns, "capped"), timeout=30, interval=0.2, message="the pod to be deleted")
    with pytest.raises(TrialStopped):
        container.session.report({"loss": 0.5})


def test_trials_survive_an_operator_restart(pod_operator, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, pod_experiment("restart", budget={"maxTrials": 2, "parallelism": 2}))
    pods = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
        pods_of(core, ns, "restart")), timeout=60, interval=0.2, message="two running pods")
    containers = [Container(core, pod, tmp_path) for pod in pods]
    for container in containers:
        container.session.report({"loss": 2.0})
    wait_for(lambda: all(len(t.get("status", {}).get("history") or []) == 1 for t in trials(custom, ns, "restart")),
             timeout=30, interval=0.2, message="the first results recorded")

    pod_operator.kill()
    pod_operator.start()
    # refused connections, then 503s until the new leader's first poll learns each trial's
    # token (after the old Lease expires), are retried until the operator is back
    for container in containers:
        container.session.report({"loss": 1.0})
        container.exit(0)
    wait_condition(custom, ns, "restart", "Succeeded", timeout=60, operator=pod_operator)
    assert sorted(p.metadata.name for p in pods_of(core, ns, "restart")) == ["restart-0-a0", "restart-1-a0"]
    for trial in trials(custom, ns, "restart"):
        assert [h["loss"] for h in trial["status"]["history"]] == [2.0, 1.0]


def test_deleting_the_experiment_deletes_its_pods(pod_operator, core, custom, pod_namespace):
    ns = pod_namespace
    create(custom, ns, pod_experiment("doomed", budget={"maxTrials": 3, "parallelism": 3}))
    wait_for(lambda: len([p for p in pods_of(core, ns, "doomed") if p.status.phase == "Running"]) == 3,
             timeout=60, interval=0.2, message="three running pods")
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "doomed")
    selector = "kubetune.dev/experiment=doomed"
    wait_for(lambda: not pods_of(core, ns, "doomed"), timeout=60, interval=0.2, message="the pods to go")
    wait_for(lambda: not core.list_namespaced_secret(ns, label_selector=selector).items
             and not core.list_namespaced_config_map(ns, label_selector=selector).items,
             timeout=60, interval=0.2, message="the trials' Secrets and ConfigMaps to go")
