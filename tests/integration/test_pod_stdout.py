"""Pod trials that print their results (spec.trial.metricsCollector: stdout): the operator
process follows each pod's log through a real kube-apiserver, which proxies ``pods/log``
to kwok's kubelet endpoint; the test plays each container by appending lines to the log
file kwok serves for it (kubetune.devcluster.kwok_logs) and ends it through kwok."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from k8s_helpers import GROUP, VERSION, create, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.devcluster.kwok import EXIT_ANNOTATION
from kubetune.devcluster.kwok_logs import ContainerLog, serve_container_log
from test_pods import bowl, core, custom, pod_experiment, pods_of  # noqa: F401 (core, custom: fixtures)

pytestmark = pytest.mark.integration


def stdout_experiment(name: str, **spec) -> dict:
    body = pod_experiment(name, **spec)
    body["spec"]["trial"]["metricsCollector"] = "stdout"
    return body


def result(metrics: dict) -> str:
    return "KUBETUNE_RESULT " + json.dumps(metrics)


class PrintingContainer:
    """One trial pod's container: what it prints goes to the log file kwok serves for it."""

    def __init__(self, api_client, pod: client.V1Pod, workdir: Path) -> None:
        self.core = client.CoreV1Api(api_client)
        self.name, self.namespace = pod.metadata.name, pod.metadata.namespace
        self.env = {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}
        self.lr = float(self.env["KUBETUNE_PARAM_LR"])
        self.log = ContainerLog(workdir / f"{self.name}.log")
        serve_container_log(api_client, self.namespace, self.name, pod.spec.containers[0].name, self.log.path)

    def print(self, *lines: str) -> None:
        self.log.print(*lines)

    def exit(self, code: int) -> None:
        self.core.patch_namespaced_pod(self.name, self.namespace,
                                       {"metadata": {"annotations": {EXIT_ANNOTATION: str(code)}}})


def running_pods(core, namespace: str, experiment: str, count: int):
    def found():
        pods = [p for p in pods_of(core, namespace, experiment) if p.status.phase == "Running"]
        return sorted(pods, key=lambda p: p.metadata.name) if len(pods) == count else None
    return wait_for(found, timeout=60, interval=0.2, message=f"{count} running pods of {experiment}")


def history(custom, namespace: str, experiment: str) -> dict[str, list[dict]]:
    return {t["metadata"]["name"]: (t.get("status") or {}).get("history") or []
            for t in trials(custom, namespace, experiment)}


@pytest.fixture(scope="module")
def admin(gpu_cluster):
    with gpu_cluster.api_client() as api:
        yield api


def test_printed_results_become_the_trials_histories(pod_operator, admin, core, custom, pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, stdout_experiment("printed", budget={"maxTrials": 2, "parallelism": 2}))
    containers = [PrintingContainer(admin, pod, tmp_path) for pod in running_pods(core, ns, "printed", 2)]
    expected = {}
    for container in containers:
        losses = [bowl(container.lr, i) for i in (1, 2, 3)]
        expected[container.name.rsplit("-a", 1)[0]] = [{"loss": loss, "iteration": i}
                                                       for i, loss in enumerate(losses, 1)]
        container.print("loading data", result({"loss": losses[0]}), "epoch 1 done",
                        "KUBETUNE_RESULT {not json}")
        container.print(result({"loss": losses[1], "iteration": 2}))
    # the followed streams deliver while the containers run
    wait_for(lambda: all(len(h) == 2 for h in history(custom, ns, "printed").values()),
             timeout=30, interval=0.2, message="two results per trial, read from the running pods' logs")
    for container in containers:
        # the last line right before the exit: read after the container ended
        container.print(result({"loss": expected[container.name.rsplit("-a", 1)[0]][2]["loss"]}))
        container.exit(0)
    done = wait_condition(custom, ns, "printed", "Succeeded", timeout=60, operator=pod_operator)

    assert history(custom, ns, "printed") == expected
    best = min(expected, key=lambda name: expected[name][-1]["loss"])
    assert done["status"]["bestTrial"]["name"] == best
    assert done["status"]["bestTrial"]["metric"] == pytest.approx(expected[best][-1]["loss"])
    assert all(t["status"]["phase"] == "Succeeded" for t in trials(custom, ns, "printed"))
    warnings = wait_for(lambda: [e for e in core.list_namespaced_event(ns).items
                                 if e.reason == "MalformedResult" and e.involved_object.kind == "Trial"],
                        timeout=10, interval=0.2, message="a MalformedResult event per trial")
    assert sorted(e.involved_object.name for e in warnings) == sorted(expected)
    assert all("not JSON" in e.message and e.type == "Warning" for e in warnings)


class _LogLines:
    """A file-like ``print`` target that appends to a container's log."""

    def __init__(self, container: PrintingContainer) -> None:
        self.container = container

    def write(self, text: str) -> None:
        lines = text.splitlines()
        if lines:
            self.container.print(*lines)

    def flush(self) -> None:
        pass


def test_kubetune_report_in_the_pod_prints_results_the_operator_reads(pod_operator, admin, core, custom,
                                                                       pod_namespace, tmp_path):
    # the same training code as for push: kubetune.report() with the environment the
    # operator gave the pod, its output going to the container's log
    from kubetune.trainable.pod_session import PodSession

    ns = pod_namespace
    create(custom, ns, stdout_experiment("reporting", budget={"maxTrials": 1, "parallelism": 1}))
    (container,) = [PrintingContainer(admin, pod, tmp_path) for pod in running_pods(core, ns, "reporting", 1)]
    assert container.env["KUBETUNE_METRICS_COLLECTOR"] == "stdout"
    # the token comes from a Secret (not in container.env): stdout mode does not use it
    session = PodSession({**container.env, "KUBETUNE_TRIAL_TOKEN": "unused"}, output=_LogLines(container))
    losses = [bowl(container.lr, i) for i in (1, 2, 3)]
    for loss in losses:
        container.print(f"training, loss {loss}")
        session.report({"loss": loss})
    container.exit(0)
    wait_condition(custom, ns, "reporting", "Succeeded", timeout=60, operator=pod_operator)
    (trial_history,) = history(custom, ns, "reporting").values()
    assert trial_history == [{"loss": loss, "iteration": i} for i, loss in enumerate(losses, 1)]


def test_an_operator_restart_rereads_the_log_without_counting_twice(pod_operator, admin, core, custom,
                                                                    pod_namespace, tmp_path):
    ns = pod_namespace
    create(custom, ns, stdout_experiment("reread", budget={"maxTrials": 1}))
    (container,) = [PrintingContainer(admin, pod, tmp_path) for pod in running_pods(core, ns, "reread", 1)]
    container.print(result({"loss": 3.0}), result({"loss": 2.0}))
    wait_for(lambda: len(history(custom, ns, "reread")["reread-0"]) == 2, timeout=30, interval=0.2,
             message="the first two results recorded")

    pod_operator.kill()
    pod_operator.start()        # follows the log from its first line again
    container.print(result({"loss": 1.0}))
    wait_for(lambda: len(history(custom, ns, "reread")["reread-0"]) >= 3, timeout=30, interval=0.2,
             message="the third result, read by the new operator process")

    pod_operator.kill()         # the last line and the exit happen while no operator runs:
    container.print(result({"loss": 0.5}))
    container.exit(0)
    wait_for(lambda: core.read_namespaced_pod(container.name, ns).status.phase == "Succeeded",
             timeout=30, interval=0.2, message="the pod to end")
    pod_operator.start()        # the next one finds the pod ended and reads its whole log once
    wait_condition(custom, ns, "reread", "Succeeded", timeout=60, operator=pod_operator)
    assert history(custom, ns, "reread")["reread-0"] == [
        {"loss": 3.0, "iteration": 1}, {"loss": 2.0, "iteration": 2}, {"loss": 1.0, "iteration": 3},
        {"loss": 0.5, "iteration": 4}]
    assert get_experiment(custom, ns, "reread")["status"]["bestTrial"]["metric"] == 0.5


def test_a_finished_pods_results_beyond_the_inbox_are_all_read_after_a_restart(pod_operator, admin, core, custom,
                                                                               pod_namespace, tmp_path):
    """AUDIT N8: a stdout trial prints more results than the inbox holds (1,000) and ends
    while no operator runs.  The next one starts the trial's box at the recorded seq (not
    -1: the log's first lines are stored already), reads the log to its end across the
    inbox's 429s, and only then lets the trial end: no result after the last recorded is lost."""
    ns = pod_namespace
    create(custom, ns, stdout_experiment("longlog", budget={"maxTrials": 1}))
    (container,) = [PrintingContainer(admin, pod, tmp_path) for pod in running_pods(core, ns, "longlog", 1)]
    container.print(result({"loss": 5000.0}), result({"loss": 4000.0}))
    wait_for(lambda: len(history(custom, ns, "longlog")["longlog-0"]) == 2, timeout=30, interval=0.2,
             message="the first two results recorded")
    pod_operator.kill()
    total = 2600
    container.print(*(result({"loss": float(total - i)}) for i in range(2, total)))
    container.exit(0)
    wait_for(lambda: core.read_namespaced_pod(container.name, ns).status.phase == "Succeeded",
             timeout=30, interval=0.2, message="the pod to end")
    pod_operator.start()
    wait_condition(custom, ns, "longlog", "Succeeded", timeout=120, operator=pod_operator)
    [trial] = trials(custom, ns, "longlog")
    assert (trial["status"]["iteration"], trial["status"]["lastResultSeq"]) == (total, total - 1)
    assert get_experiment(custom, ns, "longlog")["status"]["bestTrial"]["metric"] == 1.0   # the last line's


def test_the_stdout_collector_is_refused_for_ray_trials(custom, pod_namespace):
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": "mixed"},
            "spec": {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"x": {"uniform": [0, 1]}},
                     "trial": {"entrypoint": "m:f", "metricsCollector": "stdout"}}}
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object(GROUP, VERSION, pod_namespace, "experiments", body, dry_run="All")
    message = json.loads(refused.value.body)["message"]
    assert "spec.trial.metricsCollector" in message and "set spec.executor: pod" in message
