"""The README's KubeRay path on a real node: a RayCluster of real Ray pods, driven by
the chart's operator pod through ``ray://<head-svc>:10001``.

The KubeRay operator is built from its Go module and runs beside the embedded control
plane (kubetune.devcluster.kuberay) with its CRDs from the same module; the Ray image is
the Dockerfile's ``raycluster`` target on a stand-in for rayproject/ray (same Python and
Ray as the operator image: a Ray Client driver needs both to match).  examples/kuberay/
is applied CPU-only and small enough for a 2-core machine (no GPUs in pods here, and no
autoscaler: one CPU worker from the start).
"""
from __future__ import annotations

import json
import time
import urllib.request

import pytest
import yaml
from kubernetes import client

from k8s_helpers import experiment_gone, trials
from kube_fixtures import wait_for
from kubetune.devcluster.kuberay import KubeRay
from kubetune.devcluster.node import images
from realnode_fixtures import (HOME, REAL_NODE_MARKS, REPO, experiment_events, log, operator_image,  # noqa: F401
                               operator_pods, ready, real_cluster, release, user_namespace, wait_succeeded)

pytestmark = REAL_NODE_MARKS
CLUSTER = "kubetune-ray"


@pytest.fixture(scope="module")
def kuberay(request, release):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():     # cold: a Go build of a few minutes
        operator = KubeRay(release.plane, log=log).start()
    try:
        yield operator
    finally:
        operator.stop()


def small_raycluster(image: str) -> dict:
    """examples/kuberay/raycluster.yaml with the local image, small requests, no GPU
    group and no autoscaler (nothing to scale on one node): the head plus one worker."""
    cluster = yaml.safe_load((REPO / "examples" / "kuberay" / "raycluster.yaml").read_text())
    spec = cluster["spec"]
    spec["enableInTreeAutoscaling"] = False
    spec.pop("autoscalerOptions", None)
    small = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "3Gi"}}
    # /dev/shm of a container is 64 MiB: keep the object store small, Ray puts it in /tmp
    store = {"object-store-memory": str(100 * 1024 * 1024)}
    spec["headGroupSpec"]["rayStartParams"].update(store)
    [cpu_group] = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "cpu"]
    cpu_group.update(replicas=1, minReplicas=1, maxReplicas=1,
                     rayStartParams={"num-cpus": "2", **store})
    spec["workerGroupSpecs"] = [cpu_group]
    for template in (spec["headGroupSpec"]["template"], cpu_group["template"]):
        for container in template["spec"]["containers"]:
            container.update(image=image, imagePullPolicy="Never", resources=small)
    return cluster


def ray_pods(core, namespace: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={CLUSTER}").items


@pytest.fixture(scope="module")
def ray_cluster(request, kuberay, release):
    """The RayCluster's head and worker pods Ready, where the chart's default
    ``ray.address`` points (``kubetune-ray-head-svc.default.svc``); yields its namespace."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():     # cold: the Ray image build (pip) takes minutes
        started = time.monotonic()
        image = release.node.load(images.ray_image(images.python_image()))
        log(f"realnode: Ray image {image} ready in {time.monotonic() - started:.0f}s")
    namespace = "default"
    started = time.monotonic()
    release.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(small_raycluster(image)))
    try:
        with release.api_client() as api:
            core = client.CoreV1Api(api)
            try:
                wait_for(lambda: len([p for p in ray_pods(core, namespace) if ready(p)]) == 2,
                         timeout=600, interval=1, message="the Ray head and worker pods Ready")
            except BaseException:
                print(release.kubectl("-n", namespace, "get", "raycluster,pods", "-o", "wide"))
                print(release.kubectl("-n", namespace, "describe", "pods"))
                raise
        log(f"realnode: RayCluster head and worker Ready {time.monotonic() - started:.1f}s after kubectl apply")
        yield namespace
    finally:
        release.kubectl("-n", namespace, "delete", "raycluster", CLUSTER, "--wait=false")


def cpu_experiment(name: str, *, iterations: int, delay: float, trials_total: int) -> str:
    """examples/kuberay/experiment.yaml, CPU-only (no GPUs in pods here), on its
    ``spec.ray.address`` (the chart's default: the operator serves that cluster only)."""
    body = yaml.safe_load((REPO / "examples" / "kuberay" / "experiment.yaml").read_text())
    body["metadata"]["name"] = name
    spec = body["spec"]
    spec["trial"]["resources"] = {"cpu": 1}
    spec["trial"]["config"] = {"iterations": iterations, "delay": delay}
    spec["scheduler"].update(maxIterations=iterations, gracePeriod=1)
    spec["budget"].update(maxTrials=trials_total, parallelism=2)
    # JSON, not yaml.safe_dump: PyYAML writes the key "y" bare, which kubectl (YAML 1.1) reads as true
    return json.dumps(body)


def ray_actors(core, namespace: str, prefix: str, state: str | None = None) -> list[str]:
    """The names of the actors under ``prefix`` (in ``state``, else in any), from the
    Ray head's State API (what `ray list actors` asks)."""
    [head] = [p for p in ray_pods(core, namespace) if p.metadata.labels.get("ray.io/node-type") == "head"]
    url = f"http://{head.status.pod_ip}:8265/api/v0/actors?limit=10000&detail=false"
    with urllib.request.urlopen(url, timeout=10) as response:
        listed = json.load(response)
    return sorted(actor.get("name") or "" for actor in listed["data"]["result"]["result"]
                  if state in (None, actor.get("state")) and (actor.get("name") or "").startswith(prefix))


# ------------------------------------------------------------------ the tests

def test_the_kuberay_quickstart_succeeds_on_real_ray_pods(release, ray_cluster, user_namespace):
    name = "kuberay-quickstart"
    started = time.monotonic()
    release.kubectl("-n", user_namespace, "apply", "-f", "-",
                    input=cpu_experiment(name, iterations=5, delay=0.2, trials_total=4))
    body = wait_succeeded(release, user_namespace, name, timeout=600)
    log(f"realnode: {name} Succeeded {time.monotonic() - started:.1f}s after kubectl apply")
    best = body["status"]["bestTrial"]
    assert best["name"].startswith(name) and best["metric"] is not None, body["status"]
    assert {"TrialLaunched"} <= experiment_events(release, user_namespace, name)
    with release.api_client() as api:
        found = trials(client.CustomObjectsApi(api), user_namespace, name)
        phases = [t["status"]["phase"] for t in found]
        # ASHA may stop the poor ones early (Stopped); none fails
        assert len(found) == 4 and set(phases) <= {"Succeeded", "Stopped"} and "Succeeded" in phases, \
            [t["status"] for t in found]
        # the trials ran as actors of the RayCluster (not in the operator's pod)
        assert ray_actors(client.CoreV1Api(api), ray_cluster, f"kubetune/{user_namespace}/{name}/")


def test_kubectl_delete_mid_run_removes_the_ray_actors_within_10s(release, ray_cluster, user_namespace):
    name = "delete-ray"
    release.kubectl("-n", user_namespace, "apply", "-f", "-",
                    input=cpu_experiment(name, iterations=300, delay=1.0, trials_total=4))
    prefix = f"kubetune/{user_namespace}/{name}/"
    with release.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        wait_for(lambda: len([t for t in trials(custom, user_namespace, name)
                              if (t.get("status") or {}).get("iteration")]) == 2,
                 timeout=300, interval=0.5, message="two trials reporting")
        running = wait_for(lambda: ray_actors(core, ray_cluster, prefix, "ALIVE"), timeout=30, interval=0.5,
                           message=f"the trials' actors ALIVE on the Ray head ({prefix}*)")
        release.kubectl("-n", user_namespace, "delete", "experiment", name, "--wait=false")
        deleted = time.monotonic()
        wait_for(lambda: not ray_actors(core, ray_cluster, prefix, "ALIVE"), timeout=10, interval=0.2,
                 message=f"the Ray actors {running} gone (10 s)")
        took = time.monotonic() - deleted
        wait_for(lambda: experiment_gone(custom, user_namespace, name), timeout=30, interval=0.2,
                 message="the Experiment gone")
    log(f"realnode: {len(running)} Ray actors gone {took:.1f}s after kubectl delete")


def test_a_killed_operator_pod_is_replaced_and_the_ray_run_finishes(release, ray_cluster, user_namespace):
    """The leading operator pod dies mid-run; the trials are Ray actors, so they keep
    running, and the operator that leads next picks them up and finishes the run."""
    name = "ray-survivor"
    release.kubectl("-n", user_namespace, "apply", "-f", "-",
                    input=cpu_experiment(name, iterations=8, delay=1.0, trials_total=4))
    with release.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        wait_for(lambda: any((t.get("status") or {}).get("iteration") for t in trials(custom, user_namespace, name)),
                 timeout=300, interval=0.5, message="a first result")
        [old] = [p for p in operator_pods(core) if ready(p)]     # readiness: the leader only
        release.kubectl("-n", HOME, "delete", "pod", old.metadata.name, "--grace-period=0", "--force")
        wait_for(lambda: [p for p in operator_pods(core) if ready(p) and p.metadata.uid != old.metadata.uid],
                 timeout=180, interval=0.5, message="another operator pod leading (Ready)")
    body = wait_succeeded(release, user_namespace, name, timeout=600)
    counts = body["status"]["trialCounts"]
    assert counts["failed"] == 0 and counts["succeeded"] + counts["stopped"] == 4, body["status"]
