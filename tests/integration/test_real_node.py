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

import json
import time

import pytest
import yaml
from kubernetes import client

from k8s_helpers import experiment_gone, trials
from kube_fixtures import temporary_namespace, wait_for
from realnode_fixtures import (DASHBOARD_URL, HOME, RELEASE, REAL_NODE_MARKS, REPO, dashboard_pods,  # noqa: F401
                               experiment_events, log, operator_image, operator_pods, ready, real_cluster, release,
                               trial_pods, user_namespace, wait_succeeded)

pytestmark = REAL_NODE_MARKS


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
    if example == "pod-trials":
        check_dashboard(release, user_namespace, example, body, trials_expected)


# what a browser does through the dashboard's Service: the Experiment's address
# (status.dashboard's path) redirects to its study page; the page and its data load
DASHBOARD_PROBE = """
import json, sys, time, urllib.request
base, path, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + 90   # the store's last rows may trail the Experiment's status by a batch
while True:
    page = urllib.request.urlopen(base + path, timeout=30)
    html = page.read().decode()
    study_id = page.geturl().rsplit("/", 1)[1]
    data = json.load(urllib.request.urlopen(f"{base}/api/studies/{study_id}", timeout=60))
    states = sorted({t["state"] for t in data["trials"]})
    if (len(data["trials"]), states) == (expected, ["Complete"]) or time.monotonic() > deadline:
        break
    time.sleep(1)
listed = json.load(urllib.request.urlopen(f"{base}/api/studies", timeout=30))
print(json.dumps({"url": page.geturl(), "html": "<title>Optuna Dashboard</title>" in html,
                  "trials": len(data["trials"]), "states": states,
                  "names": [s["study_name"] for s in listed["study_summaries"]]}))
"""


def check_dashboard(release, namespace: str, name: str, body: dict, trials_expected: int) -> None:
    """The chart's dashboard Deployment (dashboard.enabled): Ready on the node, reading the
    operator's SQLite volume read-only, and its page loads through the Service."""
    path = f"/experiments/{namespace}/{name}"
    assert body["status"]["dashboard"] == DASHBOARD_URL + path
    with release.api_client() as api:
        core = client.CoreV1Api(api)
        wait_for(lambda: any(ready(p) for p in dashboard_pods(core)), timeout=120, interval=0.5,
                 message="the dashboard pod Ready")
        [pod] = [p for p in dashboard_pods(core) if ready(p)]
        assert pod.spec.automount_service_account_token is False
        assert all(not (m.mount_path or "").startswith("/var/run/secrets") for m in pod.spec.containers[0].volume_mounts)
    service = f"http://{RELEASE}-dashboard.{HOME}.svc"
    with temporary_namespace(release, "kt-dash-") as probe_namespace:
        release.kubectl("-n", probe_namespace, "run", "probe", "--image=python:3.11-slim", "--image-pull-policy=Never",
                        "--restart=Never", "--command", "--", "python", "-c", DASHBOARD_PROBE, service, path,
                        str(trials_expected))
        with release.api_client() as api:
            core = client.CoreV1Api(api)
            wait_for(lambda: core.read_namespaced_pod("probe", probe_namespace).status.phase in ("Succeeded", "Failed"),
                     timeout=180, interval=0.5, message="the dashboard probe pod")
            output = release.kubectl("-n", probe_namespace, "logs", "probe")
            assert core.read_namespaced_pod("probe", probe_namespace).status.phase == "Succeeded", output
    seen = json.loads(output.strip().splitlines()[-1])
    assert "/dashboard/studies/" in seen["url"] and seen["html"], seen
    assert seen["trials"] == trials_expected and seen["states"] == ["Complete"], seen
    assert f"{namespace}/{name}" in seen["names"], seen


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


def test_a_converted_katib_experiment_runs_as_pod_trials(release, user_namespace):
    """`kubetune convert katib` on a Katib Job + StdOut collector Experiment; the trial pods
    print Katib's `name=value` lines, which the converted container turns into results."""
    from kubetune.convert.common import render
    from kubetune.convert.katib import from_katib
    body, conversion = from_katib(str(REPO / "tests" / "integration" / "katib_random_job.yaml"))
    release.kubectl("-n", user_namespace, "apply", "-f", "-", input=render(conversion, body))
    done = wait_succeeded(release, user_namespace, "katib-random", timeout=240)
    with release.api_client() as api:
        found = trials(client.CustomObjectsApi(api), user_namespace, "katib-random")
    assert len(found) == 3 and all(t["status"]["phase"] == "Succeeded" for t in found), [t["status"] for t in found]
    for trial in found:
        status, params = trial["status"], trial["spec"]["parameters"]
        assert status["iteration"] == 4          # one result per loss= line
        assert status["lastMetrics"]["loss"] == pytest.approx((params["lr"] - 0.01) ** 2 + 1 / (4 * params["layers"]),
                                                            abs=1e-6)
        assert status["lastMetrics"]["accuracy"] == pytest.approx(1 - 1 / (4 + params["layers"]), abs=1e-4)
    assert done["status"]["bestTrial"]["metric"] == min(t["status"]["bestMetric"] for t in found)
