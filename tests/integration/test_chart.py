"""charts/kubetune against the real API server: `helm lint`, `helm template`, the
rendered manifests server-side applied, and the operator run through a whole
Experiment with ONLY the chart's ServiceAccount permissions.

The operator authenticates with a token of the chart's ServiceAccount (TokenRequest
API), exactly as in its Pod: neither the kubernetes client nor kopf honours a
kubeconfig's impersonation (`as:`) fields, so impersonation would silently run it
as the admin.  Identity is checked with a SelfSubjectReview before anything else.
Helm is built from its Go module (kubetune.devcluster.helm) on first use and cached.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from k8s_helpers import create, experiment, trials
from kube_fixtures import wait_for
from kubectl_wait import wait_for_condition
from kubetune.devcluster.helm import ensure_helm

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubetune"
GROUP, VERSION = "kubetune.dev", "v1alpha1"
FIELD_MANAGER = "kubetune-chart-test"


# ------------------------------------------------------------------ helpers

@pytest.fixture(scope="module")
def helm(request) -> Path:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():   # a cold build takes minutes: show progress
        return ensure_helm(log=lambda message: print(message, file=sys.stderr, flush=True))


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


def render(helm: Path, tmp_path: Path, release: str, namespace: str, values: dict, *,
           crds: bool = False) -> list[dict]:
    values_file = tmp_path / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    result = run_helm(helm, "template", release, str(CHART), "--namespace", namespace,
                      "-f", str(values_file), *(["--include-crds"] if crds else []))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(documents: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for document in documents:
        kinds.setdefault(document["kind"], []).append(document)
    return kinds


def apply_server_side(api_client, documents: list[dict]) -> list[dict]:
    """What `kubectl apply --server-side` does, one object at a time, CRDs first."""
    dyn = dynamic.DynamicClient(api_client)
    applied = []
    for document in sorted(documents, key=lambda d: d["kind"] != "CustomResourceDefinition"):
        resource = dyn.resources.get(api_version=document["apiVersion"], kind=document["kind"])
        result = dyn.server_side_apply(resource, body=document,
                                       namespace=document["metadata"].get("namespace"),
                                       field_manager=FIELD_MANAGER)
        applied.append(result.to_dict())
    return applied


def delete_cluster_scoped(api_client, documents: list[dict]) -> None:
    rbac = client.RbacAuthorizationV1Api(api_client)
    for document in documents:
        name = document["metadata"]["name"]
        try:
            if document["kind"] == "ClusterRole":
                rbac.delete_cluster_role(name)
            elif document["kind"] == "ClusterRoleBinding":
                rbac.delete_cluster_role_binding(name)
        except ApiException as error:
            if error.status != 404:
                raise


def service_account_kubeconfig(kube_cluster, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a bound token, 1 hour)."""
    with kube_cluster.api_client() as api_client:
        token = client.CoreV1Api(api_client).create_namespaced_service_account_token(
            name, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    admin = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name,
                                                "namespace": namespace}}],
        "current-context": name,
    }))
    path.chmod(0o600)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except OSError:
        return 0, ""


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    status, text = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def metric_sum(samples: dict, name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


@pytest.fixture
def home_namespace(kube_cluster):
    """The namespace the chart is installed in (the operator's own), not a watched one."""
    with kube_cluster.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        name = core.create_namespace({"metadata": {"generateName": "kt-chart-"}}).metadata.name
        try:
            yield name
        finally:
            core.delete_namespace(name)


# ------------------------------------------------------------------ lint / template

def test_helm_lint_is_clean(helm):
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    assert not re.search(r"\[(WARNING|ERROR)\]", result.stdout), result.stdout
    listed = run_helm(helm, "lint", "--strict", str(CHART), "--set", "watchNamespaces={team-a,team-b}")
    assert listed.returncode == 0, listed.stdout + listed.stderr


def test_template_all_namespaces_uses_a_cluster_role(helm, tmp_path):
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", {}))
    assert set(kinds) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"}
    [deployment] = kinds["Deployment"]
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]}}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {"/tmp", "/tmp/ray"} <= set(mounts) and all("emptyDir" in volumes[mounts[p]] for p in ("/tmp", "/tmp/ray"))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8082}
    assert "--metrics-port=8080" in container["args"] and "--liveness=http://0.0.0.0:8082/healthz" in container["args"]
    assert not any(a.startswith("--namespace") for a in container["args"])
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    [binding] = kinds["ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kt-kubetune", "namespace": "kubetune-system"}]


def test_template_namespace_list_uses_roles_only(helm, tmp_path):
    values = {"watchNamespaces": ["team-a", "team-b"], "ray": {"tokenSecretRef": {"name": "ray-token"}}}
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in kinds["RoleBinding"]) == ["team-a", "team-b"]
    [container] = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "ray-token", "key": "token"}}
    # the Role grants nothing on Secrets: the kubelet injects the token, not the operator
    rules = kinds["Role"][0]["rules"]
    assert not any("secrets" in r["resources"] for r in rules)
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)


def test_rendered_crds_are_the_repository_crds(helm, tmp_path):
    rendered = [d for d in render(helm, tmp_path, "kt", "kubetune-system", {}, crds=True)
                if d["kind"] == "CustomResourceDefinition"]
    expected = [d for f in sorted((REPO / "crds").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    key = lambda d: d["metadata"]["name"]  # noqa: E731
    assert sorted(rendered, key=key) == sorted(expected, key=key)


# ------------------------------------------------------------------ against the API server

def test_operator_runs_an_experiment_with_only_the_chart_permissions(
        helm, kube_cluster, ray_local, namespace, home_namespace, tmp_path):
    release = "kt"
    values = {"watchNamespaces": [namespace], "ray": {"address": ray_local}, "logLevel": "INFO"}
    documents = render(helm, tmp_path, release, home_namespace, values, crds=True)
    with kube_cluster.api_client() as admin_client:
        applied = apply_server_side(admin_client, documents)
        admin = client.CustomObjectsApi(admin_client)
        assert {a["kind"] for a in applied} >= {"CustomResourceDefinition", "ServiceAccount", "Role",
                                                "RoleBinding", "Deployment", "Service"}
        # the server kept every field the chart sets (no field pruned or rejected)
        deployment = next(a for a in applied if a["kind"] == "Deployment")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
        managers = {m["manager"] for m in deployment["metadata"]["managedFields"]}
        assert FIELD_MANAGER in managers

        account = next(d for d in documents if d["kind"] == "ServiceAccount")["metadata"]["name"]
        username = f"system:serviceaccount:{home_namespace}:{account}"
        kubeconfig = service_account_kubeconfig(kube_cluster, home_namespace, account, tmp_path / "sa.kubeconfig")
        with config.new_client_from_config(config_file=str(kubeconfig)) as sa_client:
            review = client.AuthenticationV1Api(sa_client).create_self_subject_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
            assert review.status.user_info.username == username

            metrics_port, health_port = free_port(), free_port()
            log_path = tmp_path / "operator.log"
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "RAY_USAGE_STATS_ENABLED": "0"}
            env.pop("KUBERNETES_SERVICE_HOST", None)
            with open(log_path, "w") as log_file:
                operator = subprocess.Popen(
                    [sys.executable, "-m", "kubetune", "operator", "--namespace", namespace,
                     "--ray-address", ray_local, "--checkpoint-storage", str(tmp_path / "checkpoints"),
                     "--metrics-port", str(metrics_port),
                     "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
                    env=env, stdout=log_file, stderr=subprocess.STDOUT)
            try:
                _run_experiment_and_check(admin, sa_client, admin_client, operator, log_path, namespace,
                                          home_namespace, username, metrics_port, health_port, ray_local)
            except BaseException:
                print(log_path.read_text()[-8000:])
                raise
            finally:
                if operator.poll() is None:
                    operator.send_signal(signal.SIGTERM)
                    try:
                        operator.wait(30)
                    except subprocess.TimeoutExpired:
                        operator.kill()
                        operator.wait(10)


def _run_experiment_and_check(admin, sa_client, admin_client, operator, log_path, namespace, home_namespace,
                              username, metrics_port, health_port, ray_address):
    wait_for(lambda: operator.poll() is not None or http_get(f"http://127.0.0.1:{health_port}/healthz")[0] == 200,
             timeout=60, message="the operator's liveness endpoint")
    assert operator.poll() is None, "the operator exited"

    # 3 trials of 2 GPUs on a 4-GPU Ray, 3 at a time allowed: the third waits for room
    body = experiment("rbac", budget={"maxTrials": 3, "parallelism": 3},
                      trial={"resources": {"cpu": 0.1, "gpu": 2}, "config": {"iterations": 3, "delay": 0.3}})
    create(admin, namespace, body)
    done = wait_for_condition(admin, GROUP, VERSION, namespace, "experiments", "rbac", "Succeeded", timeout=90)
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["trialCounts"]["succeeded"] == 3
    assert [t["status"]["phase"] for t in trials(admin, namespace, "rbac")] == ["Succeeded"] * 3

    # Events on the Experiment: launches, queueing, completion
    core = client.CoreV1Api(admin_client)

    def reasons():
        items = core.list_namespaced_event(namespace, field_selector="involvedObject.name=rbac").items
        return [e.reason for e in items if e.involved_object.kind == "Experiment"]
    wait_for(lambda: {"TrialLaunched", "TrialsQueued", "MaxTrialsReached"} <= set(reasons()),
             timeout=30, message=f"the Experiment's Events (so far {reasons()})")
    assert reasons().count("TrialLaunched") == 3

    # /metrics shows the finished experiment
    samples = scrape(metrics_port)
    assert metric(samples, "kubetune_experiments", phase="Succeeded") == 1
    assert metric_sum(samples, "kubetune_experiments") == 1
    assert metric(samples, "kubetune_trials", phase="succeeded") == 3
    assert metric_sum(samples, "kubetune_trials") == 3
    assert metric(samples, "kubetune_results_processed_total") == 9     # 3 trials x 3 reports
    assert metric(samples, "kubetune_api_writes_total", resource="trials", verb="create") == 3
    assert metric(samples, "kubetune_api_writes_total", resource="trials", verb="patch_status") >= 3
    assert metric(samples, "kubetune_api_writes_total", resource="experiments", verb="patch_status") >= 2
    assert metric(samples, "kubetune_events_total", type="Normal", reason="TrialLaunched") == 3
    assert metric(samples, "kubetune_events_total", type="Normal", reason="TrialsQueued") >= 1
    assert metric_sum(samples, "kubetune_reconcile_errors_total") == 0
    assert metric_sum(samples, "kubetune_queued_demand") == 0 and metric(samples, "kubetune_queued_bundles") == 0
    assert metric(samples, "kubetune_ray_connected", address=ray_address) == 1

    # deletion goes through kopf's finalizer: also within the permissions
    admin.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "rbac")

    def gone():
        try:
            admin.get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "rbac")
        except ApiException as error:
            return error.status == 404
        return False
    wait_for(gone, timeout=30, message="the Experiment's finalizer to be removed by the operator")

    # what the ServiceAccount may not do
    sa_core, sa_custom = client.CoreV1Api(sa_client), client.CustomObjectsApi(sa_client)
    forbidden = [
        lambda: sa_core.list_namespaced_secret(namespace),
        lambda: sa_core.read_namespaced_secret("anything", namespace),
        lambda: sa_custom.list_namespaced_custom_object(GROUP, VERSION, home_namespace, "experiments"),
        lambda: sa_custom.list_cluster_custom_object(GROUP, VERSION, "experiments"),
        lambda: sa_custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trials", "rbac-0"),
        lambda: sa_core.list_namespace(),
    ]
    for call in forbidden:
        with pytest.raises(ApiException) as info:
            call()
        assert info.value.status == 403, info.value.body
        assert username in json.loads(info.value.body)["message"]

    log = log_path.read_text()
    assert operator.poll() is None, log[-5000:]
    for symptom in ("Forbidden", "403", "Not enough permissions"):
        assert symptom not in log, f"{symptom!r} in the operator log:\n{log[-5000:]}"


def test_cluster_wide_install_is_accepted_and_denies_secrets(helm, kube_cluster, home_namespace, namespace, tmp_path):
    """All namespaces: the same rules in a ClusterRole (the namespaced run above proves
    them sufficient); the server accepts the objects, and the account can list
    Experiments everywhere but still read no Secret."""
    release = f"kt-{home_namespace}"   # cluster-scoped names must not collide between runs
    documents = render(helm, tmp_path, release, home_namespace, {})
    with kube_cluster.api_client() as admin_client:
        try:
            applied = apply_server_side(admin_client, documents)
            # the KubeRay example's Experiment is accepted by the CRDs the chart installs
            example = yaml.safe_load((REPO / "examples" / "kuberay" / "experiment.yaml").read_text())
            client.CustomObjectsApi(admin_client).create_namespaced_custom_object(
                GROUP, VERSION, namespace, "experiments", example, dry_run="All")
            [role] = [a for a in applied if a["kind"] == "ClusterRole"]
            assert role["rules"] == next(d for d in documents if d["kind"] == "ClusterRole")["rules"]
            account = next(d for d in documents if d["kind"] == "ServiceAccount")["metadata"]["name"]
            kubeconfig = service_account_kubeconfig(kube_cluster, home_namespace, account, tmp_path / "sa.kubeconfig")
            with config.new_client_from_config(config_file=str(kubeconfig)) as sa_client:
                sa_custom, sa_core = client.CustomObjectsApi(sa_client), client.CoreV1Api(sa_client)
                sa_custom.list_cluster_custom_object(GROUP, VERSION, "experiments")
                sa_custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trials")
                for call in (lambda: sa_core.list_secret_for_all_namespaces(),
                             lambda: sa_core.list_namespaced_secret(namespace),
                             lambda: sa_custom.delete_collection_namespaced_custom_object(
                                 GROUP, VERSION, namespace, "experiments")):
                    with pytest.raises(ApiException) as info:
                        call()
                    assert info.value.status == 403
        finally:
            delete_cluster_scoped(admin_client, documents)
