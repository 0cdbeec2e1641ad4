"""The README's KubeRay path on a real node: a RayCluster of real Ray pods, driven by
the chart's operator pod through ``ray://<head-svc>:10001``.

The KubeRay operator is built from its Go module and runs beside the embedded control
plane (kubetune.devcluster.kuberay) with its CRDs from the same module; the Ray image is
the Dockerfile's ``raycluster`` target on a stand-in for rayproject/ray (same Python and
Ray as the operator image: a Ray Client driver needs both to match).
examples/kuberay/raycluster.yaml is applied as written but small enough for a 2-core
machine: KubeRay's in-tree autoscaler (a sidecar of the head, from the same image), the
CPU group fixed at one worker, and the GPU group from zero to ``GPUS`` one-GPU pods.
The GPUs are the node's advertised ``nvidia.com/gpu`` (Node.advertise: a count with no
device behind it), which is all Ray needs: KubeRay starts each GPU worker with
``num-gpus`` from its limits and Ray hands the trials logical GPUs in
``CUDA_VISIBLE_DEVICES``.
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
GPU = "nvidia.com/gpu"
GPUS = 2              # the node's advertised GPUs: the GPU group's maxReplicas (one per pod)
IDLE_SECONDS = 20     # an idle GPU worker goes after this (the example: 120)


@pytest.fixture(scope="module")
def kuberay(request, release):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():     # cold: a Go build of a few minutes
        operator = KubeRay(release.plane, log=log).start()
    try:
        yield operator
    finally:
        operator.stop()


def raycluster(image: str) -> dict:
    """examples/kuberay/raycluster.yaml with the local image, small requests, a short
    idle timeout, the CPU group fixed at one worker and the GPU group from 0 to GPUS."""
    cluster = yaml.safe_load((REPO / "examples" / "kuberay" / "raycluster.yaml").read_text())
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"], "the example scales its groups with KubeRay's autoscaler"
    spec["autoscalerOptions"].update(idleTimeoutSeconds=IDLE_SECONDS, imagePullPolicy="Never")
    small = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "3Gi"}}
    # /dev/shm of a container is 64 MiB: keep the object store small, Ray puts it in /tmp
    store = {"object-store-memory": str(100 * 1024 * 1024)}
    spec["headGroupSpec"]["rayStartParams"].update(store)
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    cpu_group, gpu_group = groups["cpu"], groups["gpu"]
    cpu_group.update(replicas=1, minReplicas=1, maxReplicas=1, rayStartParams={"num-cpus": "2", **store})
    assert gpu_group["minReplicas"] == gpu_group["replicas"] == 0, "the example's GPU group starts at zero"
    # no num-gpus: KubeRay takes it from the container's nvidia.com/gpu limit, as on real GPUs
    gpu_group.update(maxReplicas=GPUS, rayStartParams={"num-cpus": "1", **store})
    for template in (spec["headGroupSpec"]["template"], cpu_group["template"]):
        for container in template["spec"]["containers"]:
            container.update(image=image, imagePullPolicy="Never", resources=small)
    [gpu_container] = gpu_group["template"]["spec"]["containers"]
    assert gpu_container["resources"]["limits"][GPU] == "1"
    gpu_container.update(image=image, imagePullPolicy="Never",
                         resources={"requests": {"cpu": "100m", "memory": "512Mi", GPU: "1"},
                                    "limits": {"memory": "3Gi", GPU: "1"}})
    spec["workerGroupSpecs"] = [cpu_group, gpu_group]
    return cluster


def ray_pods(core, namespace: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={CLUSTER}").items


def gpu_workers(core, namespace: str) -> list:
    """The GPU group's pods (not those being deleted)."""
    return [p for p in core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={CLUSTER},"
                                                "ray.io/group=gpu").items if p.metadata.deletion_timestamp is None]


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
    release.node.advertise({GPU: GPUS})
    started = time.monotonic()
    release.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(raycluster(image)))
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


def example_experiment(name: str, *, iterations: int, delay: float, trials_total: int, gpu: bool = False) -> str:
    """examples/kuberay/experiment.yaml on its ``spec.ray.address`` (the chart's default:
    the operator serves that cluster only), shorter; CPU-only unless ``gpu`` (the
    example's one GPU and one CPU per trial, GPUS at a time)."""
    body = yaml.safe_load((REPO / "examples" / "kuberay" / "experiment.yaml").read_text())
    body["metadata"]["name"] = name
    spec = body["spec"]
    assert spec["trial"]["resources"] == {"cpu": 1, "gpu": 1}
    if not gpu:
        spec["trial"]["resources"] = {"cpu": 1}
    spec["trial"]["config"] = {"iterations": iterations, "delay": delay}
    spec["scheduler"].update(maxIterations=iterations, gracePeriod=1)
    spec["budget"].update(maxTrials=trials_total, parallelism=GPUS if gpu else 2)
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
                    input=example_experiment(name, iterations=5, delay=0.2, trials_total=4))
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
                    input=example_experiment(name, iterations=300, delay=1.0, trials_total=4))
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
                    input=example_experiment(name, iterations=8, delay=1.0, trials_total=4))
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


def test_gpu_trials_scale_the_gpu_group_from_zero_and_back(release, ray_cluster, user_namespace):
    """The example's one-GPU trials: Queued while no GPU worker runs, the operator's
    autoscaler request makes KubeRay's autoscaler add GPUS GPU pods, every trial sees
    its GPU, and the idle GPU workers go away again."""
    name = "kuberay-gpu"
    peak = 0

    def count_gpu_workers() -> None:
        nonlocal peak
        peak = max(peak, len(gpu_workers(core, ray_cluster)))

    with release.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        assert not gpu_workers(core, ray_cluster), "minReplicas 0: no GPU worker before a trial asks"
        started = time.monotonic()
        release.kubectl("-n", user_namespace, "apply", "-f", "-",
                        input=example_experiment(name, iterations=8, delay=1.0, trials_total=4, gpu=True))
        body = wait_succeeded(release, user_namespace, name, timeout=900, each=count_gpu_workers)
        finished = time.monotonic()
        log(f"realnode: {name} Succeeded {finished - started:.1f}s after kubectl apply, {peak} GPU workers at most")
        # GPUS trials at a time, one GPU each, and none to start with: GPUS pods came
        assert peak == GPUS, f"{peak} GPU worker pods at most, wanted {GPUS}"
        assert "TrialsQueued" in experiment_events(release, user_namespace, name)
        counts = body["status"]["trialCounts"]
        assert counts["failed"] == 0 and counts["succeeded"] + counts["stopped"] == 4, body["status"]
        # each trial saw one GPU (Ray's CUDA_VISIBLE_DEVICES, reported by the quadratic as "gpus")
        seen = {t["metadata"]["name"]: (t["status"].get("lastMetrics") or {}).get("gpus")
                for t in trials(custom, user_namespace, name)}
        assert set(seen.values()) == {1}, seen
        wait_for(lambda: not gpu_workers(core, ray_cluster), timeout=IDLE_SECONDS + 240, interval=1,
                 message=f"the idle GPU workers removed (idle timeout {IDLE_SECONDS}s)")
        log(f"realnode: GPU workers gone {time.monotonic() - finished:.1f}s after the run (idle timeout {IDLE_SECONDS}s)")
