"""The README's cluster path on a real node: every container really runs.

The embedded control plane plus a real node (kubetune.devcluster.node: containerd,
runc, CNI bridge, kube-proxy, cluster DNS, kubelet), the operator image built from the
repository's Dockerfile with buildah and imported (no registry), then what a platform
team does: ``helm install`` charts/kubetune (its own RBAC only), ``kubectl apply`` the
examples, watch them succeed, ``kubectl delete`` an Experiment mid-run, kill the
operator's pod.  The operator runs only inside its pod; every trial is a pod.

Linux and root only (containerd, iptables, mounts); the first run installs Debian
packages and builds the node binaries and images (cached afterwards).  One node per
machine: concurrent runs wait for each other on a lock.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from k8s_helpers import GROUP, VERSION, condition, experiment_gone, trials
from kube_fixtures import temporary_namespace, wait_for
from kubetune.devcluster.build import ensure_binaries
from kubetune.devcluster.helm import ensure_helm
from kubetune.devcluster.node import images
from kubetune.devcluster.node.node import Node, start_cluster, why_not_here

REPO = Path(__file__).resolve().parents[2]
RELEASE, HOME = "kubetune", "kubetune-system"
MACHINE_LOCK = Path("/run/kubetune-node.lock")

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(why_not_here()), reason=str(why_not_here())),
              # the first test carries the module's setup: packages, builds, images when cold
              pytest.mark.timeout(3600)]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)



class RealCluster:
    """The plane + node, with the tools a user has: kubectl and helm."""

    def __init__(self, plane, node: Node, kubectl: Path, helm: Path):
        self.plane, self.node, self.kubectl_path, self.helm_path = plane, node, kubectl, helm
        self.kubeconfig = plane.kubeconfig

    def api_client(self):
        return self.plane.api_client()

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> str:
        result = subprocess.run([str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args],
                                input=input, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def helm(self, *args: str, timeout: float = 180) -> str:
        result = subprocess.run([str(self.helm_path), f"--kubeconfig={self.kubeconfig}", *args],
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
        return result.stdout


@contextlib.contextmanager
def machine_lock(timeout: float = 3600):
    """One node per machine (bridge, iptables, containerd): wait for another run's."""
    with open(MACHINE_LOCK, "w") as lock:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run held {MACHINE_LOCK} for {timeout:.0f}s")
                time.sleep(1)
        yield


@pytest.fixture(scope="module")
def real_cluster(request, tmp_path_factory):
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with machine_lock():
        with capture.global_and_fixture_disabled():     # cold: packages, builds, images take minutes
            started = time.monotonic()
            tools = ensure_binaries(["kubectl"], log=log)["kubectl"], ensure_helm(log=log)
            plane, node = start_cluster(tmp_path_factory.mktemp("realnode"), log=log, die_with_parent=True)
            log(f"realnode: cluster with a Ready node in {time.monotonic() - started:.0f}s")
        try:
            yield RealCluster(plane, node, *tools)
        finally:
            try:
                node.stop()
            finally:
                plane.stop()


@pytest.fixture(scope="module")
def operator_image(request, real_cluster) -> str:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        started = time.monotonic()
        name = real_cluster.node.load(images.operator_image(images.python_image()))
        log(f"realnode: operator image {name} ready in {time.monotonic() - started:.0f}s")
    return name


def operator_pods(core) -> list:
    pods = core.list_namespaced_pod(HOME, label_selector=f"app.kubernetes.io/instance={RELEASE}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


@pytest.fixture(scope="module")
def release(real_cluster, operator_image):
    """``helm install`` of charts/kubetune, as the README says, with the locally built image."""
    repository, tag = operator_image.rsplit(":", 1)
    # the chart's results PVC (default values) needs a volume: this node has no
    # provisioner, so a hostPath PersistentVolume it can bind, writable by the operator
    results = real_cluster.node.dir / "volumes" / "results"
    results.mkdir(parents=True, exist_ok=True)
    results.chmod(0o777)
    real_cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "kubetune-results"},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(results)}}}))
    real_cluster.helm("install", RELEASE, str(REPO / "charts" / "kubetune"), "--namespace", HOME,
                      "--create-namespace", "--set", f"image.repository={repository}",
                      "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
                      "--set", "podExecutor.enabled=true")
    with real_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        try:
            wait_for(lambda: any(ready(p) for p in operator_pods(core)), timeout=180, interval=0.5,
                     message="the operator pod Ready")
        except BaseException:
            print(real_cluster.kubectl("-n", HOME, "describe", "pods"))
            print(real_cluster.kubectl("-n", HOME, "logs", "deploy/" + RELEASE, "--tail=80"))
            raise
    yield real_cluster


@pytest.fixture
def user_namespace(release):
    with temporary_namespace(release, "kt-node-") as name:
        yield name


def get_experiment(api, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", name)


def wait_succeeded(cluster: RealCluster, namespace: str, name: str, timeout: float) -> dict:
    with cluster.api_client() as api:
        def finished():
            body = get_experiment(api, namespace, name)
            failed = condition(body, "Failed")
            assert not (failed and failed["status"] == "True"), body["status"]
            done = condition(body, "Succeeded")
            return body if done and done["status"] == "True" else None
        try:
            return wait_for(finished, timeout=timeout, interval=1, message=f"{name} Succeeded")
        except BaseException:
            print(cluster.kubectl("-n", namespace, "get", "experiments,trials,pods", "-o", "wide"))
            print(cluster.kubectl("-n", HOME, "logs", "deploy/" + RELEASE, "--tail=100"))
            raise


def experiment_events(cluster: RealCluster, namespace: str, name: str) -> set[str]:
    listed = json.loads(cluster.kubectl("-n", namespace, "get", "events", "-o", "json",
                                        f"--field-selector=involvedObject.name={name}"))
    return {event["reason"] for event in listed["items"]}


def trial_pods(core, namespace: str, name: str) -> list:
    return core.list_namespaced_pod(namespace, label_selector=f"kubetune.dev/experiment={name}").items


# ------------------------------------------------------------------ the tests

def test_the_chart_runs_the_operator_in_a_pod(release):
    """The image from the Dockerfile, the chart's Deployment: Ready, not restarting, and
    no service-link variable in its environment (the old crash loop)."""
    with release.api_client() as api:
        core = client.CoreV1Api(api)
        [pod] = [p for p in operator_pods(core) if ready(p)]
        assert pod.spec.enable_service_links is False
        [status] = pod.status.container_statuses
        assert status.restart_count == 0 and status.ready
        env = release.kubectl("-n", HOME, "exec", pod.metadata.name, "--", "env")
        assert "KUBETUNE_METRICS_PORT" not in env and "KUBERNETES_SERVICE_HOST=10.0.0.1" in env
    # the metrics Service answers another pod, through cluster DNS and kube-proxy
    with temporary_namespace(release, "kt-probe-") as namespace:
        # python, not busybox: Debian's static busybox cannot resolve names through libc
        url = f"http://{RELEASE}-metrics.{HOME}.svc:8080/metrics"
        release.kubectl("-n", namespace, "run", "probe", "--image=python:3.11-slim", "--image-pull-policy=Never",
                        "--restart=Never", "--command", "--", "python", "-c",
                        f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())")
        with release.api_client() as api:
            core = client.CoreV1Api(api)
            wait_for(lambda: core.read_namespaced_pod("probe", namespace).status.phase in ("Succeeded", "Failed"),
                     timeout=60, interval=0.5, message="the probe pod")
            phase = core.read_namespaced_pod("probe", namespace).status.phase
            assert phase == "Succeeded", release.kubectl("-n", namespace, "logs", "probe")
        assert "kubetune_" in release.kubectl("-n", namespace, "logs", "probe")


@pytest.mark.parametrize("example, trials_expected, metric", [
    ("pod-trials", 8, "loss"),
    ("pod-stdout", 6, "loss"),
])
def test_the_pod_examples_succeed(release, user_namespace, example, trials_expected, metric):
    release.kubectl("-n", user_namespace, "apply", "-f", str(REPO / "examples" / f"{example}.yaml"))
    body = wait_succeeded(release, user_namespace, example, timeout=300)
    best = body["status"]["bestTrial"]
    assert best["name"].startswith(example) and best["metric"] is not None and best["iteration"] == (
        10 if example == "pod-trials" else 5)
    with release.api_client() as api:
        found = trials(client.CustomObjectsApi(api), user_namespace, example)
    assert len(found) == trials_expected
    assert all(t["status"]["phase"] == "Succeeded" for t in found), [t["status"] for t in found]
    assert {"TrialLaunched"} <= experiment_events(release, user_namespace, example)
    table = release.kubectl("-n", user_namespace, "get", "trials")
    assert table.count("Succeeded") == trials_expected


def long_experiment(name: str, *, steps: int, step_seconds: float, trials_total: int, parallelism: int) -> str:
    """pod-trials' shape with a slow trial that stops cleanly on SIGTERM (PID 1 has no
    default signal handlers)."""
    body = yaml.safe_load((REPO / "examples" / "pod-trials.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["budget"] = {"maxTrials": trials_total, "parallelism": parallelism}
    body["spec"]["trial"]["resources"] = {"cpu": 0.1, "memory": "64Mi"}
    container = body["spec"]["trial"]["template"]["spec"]["containers"][0]
    script = container["args"][0]
    container["args"][0] = ("import signal\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
                            + script.replace("range(int(os.environ[\"KUBETUNE_START_ITERATION\"]) + 1, 11)",
                                             f"range(int(os.environ[\"KUBETUNE_START_ITERATION\"]) + 1, {steps + 1})")
                            .replace("    seq += 1", f"    seq += 1\n    __import__('time').sleep({step_seconds})"))
    return yaml.safe_dump(body)


def test_kubectl_delete_mid_run_removes_the_trial_pods_within_10s(release, user_namespace):
    name = "delete-me"
    release.kubectl("-n", user_namespace, "apply", "-f", "-",
                    input=long_experiment(name, steps=300, step_seconds=1, trials_total=4, parallelism=2))
    with release.api_client() as api:
        core = client.CoreV1Api(api)
        wait_for(lambda: len([p for p in trial_pods(core, user_namespace, name) if p.status.phase == "Running"]) == 2,
                 timeout=120, interval=0.5, message="two running trial pods")
        custom = client.CustomObjectsApi(api)
        wait_for(lambda: any((t.get("status") or {}).get("iteration") for t in trials(custom, user_namespace, name)),
                 timeout=60, interval=0.5, message="a first result")
        release.kubectl("-n", user_namespace, "delete", "experiment", name, "--wait=false")
        deleted = time.monotonic()
        wait_for(lambda: not trial_pods(core, user_namespace, name), timeout=10, interval=0.2,
                 message="the trial pods gone (10 s)")
        took = time.monotonic() - deleted
        wait_for(lambda: experiment_gone(custom, user_namespace, name), timeout=10, interval=0.2,
                 message="the Experiment gone")
    log(f"realnode: trial pods gone {took:.1f}s after kubectl delete")


def test_a_killed_operator_pod_is_replaced_and_the_run_finishes(release, user_namespace):
    name = "survivor"
    release.kubectl("-n", user_namespace, "apply", "-f", "-",
                    input=long_experiment(name, steps=8, step_seconds=1, trials_total=4, parallelism=2))
    with release.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        wait_for(lambda: any((t.get("status") or {}).get("iteration") for t in trials(custom, user_namespace, name)),
                 timeout=120, interval=0.5, message="a first result")
        [old] = [p for p in operator_pods(core) if ready(p)]
        release.kubectl("-n", HOME, "delete", "pod", old.metadata.name, "--grace-period=0", "--force")
        wait_for(lambda: [p for p in operator_pods(core) if ready(p) and p.metadata.uid != old.metadata.uid],
                 timeout=180, interval=0.5, message="the Deployment's new operator pod Ready")
    body = wait_succeeded(release, user_namespace, name, timeout=300)
    assert body["status"]["trialCounts"]["succeeded"] == 4, body["status"]
