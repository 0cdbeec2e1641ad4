"""Pod trials that can never run, against the real API server (Pod Security admission
included), the kube-scheduler and kwok playing the kubelet: each is reported with the
reason the platform gave, never left Running."""
from __future__ import annotations

import json

import pytest
from kubernetes import client

from kube_fixtures import Kubectl, wait_for
from kubetune.devcluster.build import kubectl as kubectl_binary
from kubetune.devcluster.kwok import WAITING_ANNOTATION, WAITING_SINCE_ANNOTATION

pytestmark = pytest.mark.integration

GROUP, VERSION = "kubetune.dev", "v1alpha1"


@pytest.fixture(scope="module")
def kubectl(gpu_cluster):
    return Kubectl(kubectl_binary(log=lambda message: None), gpu_cluster.kubeconfig)


@pytest.fixture(scope="module")
def core(gpu_cluster):
    with gpu_cluster.api_client() as api:
        yield client.CoreV1Api(api)


def pod_experiment(name: str, annotations: dict | None = None, security: dict | None = None) -> dict:
    container = {"name": "train", "image": "example.com/trainer:1", "command": ["python", "-m", "train"],
                 **({"securityContext": security} if security else {})}
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": name},
        "spec": {
            "executor": "pod",
            "objective": {"metric": "loss", "mode": "min"},
            "searchSpace": {"lr": {"uniform": [0.0, 1.0]}},
            "budget": {"maxTrials": 10, "parallelism": 2},
            "trial": {"resources": {"cpu": 1},
                      "template": {"metadata": {"annotations": annotations or {}},
                                   "spec": {"containers": [container]}}},
        },
    }


def get(kubectl, namespace: str, kind: str, name: str) -> dict:
    return json.loads(kubectl("get", "-n", namespace, kind, name, "-o", "json").stdout)


def failed_condition(kubectl, namespace: str, name: str) -> dict | None:
    status = get(kubectl, namespace, "experiment", name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "Failed" and c["status"] == "True"),
                None)


def test_an_image_that_cannot_be_pulled_is_queued_with_the_kubelets_reason(pod_operator, kubectl, pod_namespace):
    kubectl("create", "-n", pod_namespace, "-f", "-",
            input=json.dumps(pod_experiment("nopull", {WAITING_ANNOTATION: "ImagePullBackOff"})))

    def queued_trial():
        trials = json.loads(kubectl("get", "-n", pod_namespace, "trials", "-o", "json").stdout)["items"]
        return next((t for t in trials if t["spec"]["experiment"] == "nopull"
                     and (t.get("status") or {}).get("phase") == "Queued"), None)
    trial = wait_for(queued_trial, timeout=60, interval=0.5, message="a Queued trial")
    assert trial["status"]["reason"] == "ImagePullBackOff"
    assert "simulated ImagePullBackOff for image example.com/trainer:1" in trial["status"]["message"]
    kubectl("delete", "-n", pod_namespace, "experiment", "nopull", "--timeout=60s", timeout=90)


def test_an_image_that_stays_unpullable_fails_the_experiment_fast(pod_operator, kubectl, pod_namespace):
    # the pod "started" long ago: past the 120 s the kubelet gets to pull the image
    annotations = {WAITING_ANNOTATION: "ImagePullBackOff", WAITING_SINCE_ANNOTATION: "2020-01-01T00:00:00Z"}
    kubectl("create", "-n", pod_namespace, "-f", "-", input=json.dumps(pod_experiment("stuck", annotations)))
    failed = wait_for(lambda: failed_condition(kubectl, pod_namespace, "stuck"), timeout=90, interval=0.5,
                      message="stuck Failed")
    assert failed["reason"] == "SystematicFailure", failed
    assert "ImagePullBackOff" in failed["message"] and "the limit is 120s" in failed["message"], failed
    status = get(kubectl, pod_namespace, "experiment", "stuck")["status"]
    assert status["trialCounts"]["created"] <= 2
    kubectl("delete", "-n", pod_namespace, "experiment", "stuck", "--timeout=60s", timeout=90)


def test_a_pod_forbidden_by_pod_security_fails_the_experiment_naming_it(pod_operator, kubectl, pod_namespace):
    # kubetune's own policy lets the namespace have privileged trial pods (its opt-in label):
    # what refuses the pod here is the API server's Pod Security admission
    kubectl("label", "namespace", pod_namespace, "pod-security.kubernetes.io/enforce=baseline",
            "pod-security.kubetune.dev/allow-privileged=true", "--overwrite")
    try:
        kubectl("create", "-n", pod_namespace, "-f", "-",
                input=json.dumps(pod_experiment("privileged", security={"privileged": True})))
        failed = wait_for(lambda: failed_condition(kubectl, pod_namespace, "privileged"), timeout=90,
                          interval=0.5, message="privileged Failed")
    finally:
        kubectl("label", "namespace", pod_namespace, "pod-security.kubernetes.io/enforce-",
                "pod-security.kubetune.dev/allow-privileged-")
    assert failed["reason"] == "SystematicFailure", failed
    assert "the trial pod is refused" in failed["message"] and "PodSecurity" in failed["message"], failed
    assert "most often PodRefused (" in failed["message"]
