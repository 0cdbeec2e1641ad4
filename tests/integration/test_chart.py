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

import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from k8s_helpers import GROUP, VERSION, create, experiment, experiment_gone, trials
from kube_fixtures import KubeCluster, temporary_namespace, wait_for
from kubectl_wait import wait_for_condition
from kubetune.devcluster import ControlPlane
from kubetune.devcluster.helm import ensure_helm
from kubetune.devcluster.processes import free_port, terminate

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubetune"
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
    crds = [d["metadata"]["name"] for d in documents if d["kind"] == "CustomResourceDefinition"]
    extensions = client.ApiextensionsV1Api(api_client)
    # the operator reads the API's discovery once at startup: the CRDs must be served by then
    wait_for(lambda: all(any(c.type == "Established" and c.status == "True"
                             for c in extensions.read_custom_resource_definition(name).status.conditions or [])
                         for name in crds), timeout=60, message="the chart's CRDs to be Established")
    return applied


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
    with temporary_namespace(kube_cluster, "kt-chart-") as name:
        yield name


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
    assert set(kinds) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                          "PersistentVolumeClaim", "Role", "RoleBinding",
                          "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    # the search-space size limit (tests/integration/test_search_space_size.py), on every namespace
    [size_binding] = kinds["ValidatingAdmissionPolicyBinding"]
    assert size_binding["spec"]["policyName"] == "kt-kubetune-search-space-size"
    assert "matchResources" not in size_binding["spec"]
    [deployment] = kinds["Deployment"]
    spec = deployment["spec"]
    # two replicas, one drives: the holder of the Lease (a Role in the release namespace)
    assert spec["replicas"] == 2 and spec["strategy"] == {"type": "RollingUpdate"}
    [lease_role] = kinds["Role"]
    assert lease_role["metadata"]["namespace"] == "kubetune-system"
    assert {tuple(r["verbs"]) for r in lease_role["rules"]} == {("create",), ("get", "update")}
    assert all(r["resources"] == ["leases"] for r in lease_role["rules"])
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["enableServiceLinks"] is False     # see tests/unit/test_settings.py
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]}}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {"/tmp", "/tmp/ray"} <= set(mounts) and all("emptyDir" in volumes[mounts[p]] for p in ("/tmp", "/tmp/ray"))
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}   # the leader only
    assert "--leader-election" in container["args"] and "--lease-name=kt-kubetune" in container["args"]
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
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == ["kubetune-system", "team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in kinds["RoleBinding"]) == ["kubetune-system", "team-a", "team-b"]
    [container] = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--namespace")] == [
        "--namespace=team-a", "--namespace=team-b"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "ray-token", "key": "token"}}
    # the Role grants nothing on Secrets: the kubelet injects the token, not the operator
    rules = next(r for r in kinds["Role"] if r["metadata"]["namespace"] == "team-a")["rules"]
    assert not any("secrets" in r["resources"] for r in rules)
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)


def test_template_kueue_grants_only_reading_workloads_and_localqueues(helm, tmp_path):
    def rules(values: dict) -> list[dict]:
        return by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))["ClusterRole"][0]["rules"]

    kueue = [r for r in rules({"podExecutor": {"enabled": True, "clusterWide": True, "kueue": {"enabled": True}}})
             if "kueue.x-k8s.io" in r["apiGroups"]]
    assert kueue == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"],
                      "verbs": ["get", "list", "watch"]}]
    assert not any("kueue.x-k8s.io" in r["apiGroups"]
                   for r in rules({"podExecutor": {"enabled": True, "clusterWide": True}}))


def operator_container(kinds: dict[str, list[dict]]) -> dict:
    [deployment] = kinds["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_template_results_store_defaults_to_sqlite_on_a_kept_pvc(helm, tmp_path):
    from kubetune import cli
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", {}))
    [claim] = kinds["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "kt-kubetune-results"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"   # survives helm uninstall
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in claim["spec"]
    container = operator_container(kinds)
    pod = kinds["Deployment"][0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/kubetune"]
    assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": "kt-kubetune-results"}
    assert pod["securityContext"]["fsGroup"] == 10001          # the non-root operator can write the volume
    # the two replicas share that ReadWriteOnce volume: one node for both
    [term] = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == kinds["Deployment"][0]["spec"]["selector"]["matchLabels"]
    args = cli.build_parser().parse_args(["operator", *container["args"]])   # the operator takes these flags
    assert args.results_url == "sqlite:////var/lib/kubetune/results.db"
    from kubetune.settings import from_args
    assert from_args(args).results_url == "sqlite:////var/lib/kubetune/results.db"   # and they are valid
    assert "KUBETUNE_RESULTS_URL" not in {e["name"] for e in container["env"]}

    claimed = by_kind(render(helm, tmp_path, "kt2", "kubetune-system", {"results": {"sqlite": {"persistence": {
        "existingClaim": "my-results", "size": "50Gi", "storageClassName": "fast"}}}}))
    assert "PersistentVolumeClaim" not in claimed
    volumes = {v["name"]: v for v in claimed["Deployment"][0]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["results"]["persistentVolumeClaim"] == {"claimName": "my-results"}
    ephemeral = by_kind(render(helm, tmp_path, "kt3", "kubetune-system",
                               {"results": {"sqlite": {"persistence": {"enabled": False}}}}))
    assert "PersistentVolumeClaim" not in ephemeral
    volumes = {v["name"]: v for v in ephemeral["Deployment"][0]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["results"] == {"name": "results", "emptyDir": {}}


def test_template_results_store_on_postgres_takes_its_url_from_a_secret(helm, tmp_path):
    values = {"results": {"postgres": {"urlSecretRef": {"name": "kubetune-db"}}}}
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))
    assert "PersistentVolumeClaim" not in kinds
    container = operator_container(kinds)
    env = {e["name"]: e for e in container["env"]}
    assert env["KUBETUNE_RESULTS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "kubetune-db", "key": "url"}}
    assert not any(a.startswith("--results-url") for a in container["args"])   # a password never in args
    assert "/var/lib/kubetune" not in {m["mountPath"] for m in container["volumeMounts"]}
    assert "affinity" not in kinds["Deployment"][0]["spec"]["template"]["spec"]    # replicas on any node
    # the kubelet reads the Secret; the operator's RBAC still grants nothing on Secrets
    assert not any("secrets" in r["resources"] for r in kinds["ClusterRole"][0]["rules"])
    invalid = run_helm(helm, "template", "kt", str(CHART), "--set", "results.postgres.urlSecretRef.key=")
    assert invalid.returncode != 0 and "key" in invalid.stderr


def test_rendered_crds_are_the_repository_crds(helm, tmp_path):
    rendered = [d for d in render(helm, tmp_path, "kt", "kubetune-system", {}, crds=True)
                if d["kind"] == "CustomResourceDefinition"]
    expected = [d for f in sorted((REPO / "crds").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    key = lambda d: d["metadata"]["name"]  # noqa: E731
    assert sorted(rendered, key=key) == sorted(expected, key=key)


# ------------------------------------------------------------------ against the API server

class ChartOperator:
    """The chart applied server-side, and `kubetune operator` running with nothing but
    its ServiceAccount's token (the operator's Pod cannot run here: no kubelet)."""

    def __init__(self, helm: Path, cluster, ray_address: str, workdir: Path, *, release: str,
                 home: str, values: dict) -> None:
        self.cluster, self.ray_address, self.workdir, self.home = cluster, ray_address, workdir, home
        self.documents = render(helm, workdir, release, home, {**values, "ray": {"address": ray_address}},
                                crds=True)
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / f"operator-{release}.log"
        self.metrics_port, self.health_port = free_port(), free_port()

    def install(self, admin_client) -> list[dict]:
        applied = apply_server_side(admin_client, self.documents)
        account = next(d for d in self.documents if d["kind"] == "ServiceAccount")["metadata"]["name"]
        self.username = f"system:serviceaccount:{self.home}:{account}"
        self.kubeconfig = service_account_kubeconfig(self.cluster, self.home, account,
                                                     self.workdir / f"{account}.kubeconfig")
        return applied

    def chart_switches(self) -> list[str]:
        """The chart Deployment's switches of the operator (pod executor, pod policy):
        the process runs as the chart configures it."""
        [deployment] = [d for d in self.documents if d["kind"] == "Deployment"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        return [a for a in container["args"] if a.startswith("--pod-")]

    def start(self, namespaces: list[str]) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("KUBERNETES_SERVICE_HOST", None)     # never the in-cluster config
        [deployment] = [d for d in self.documents if d["kind"] == "Deployment"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        # the chart's leader election, its Lease in the release namespace (POD_NAMESPACE in a Pod)
        election = [a for a in container["args"] if a.startswith(("--leader-election", "--lease-name"))]
        if election:
            election.append(f"--lease-namespace={self.home}")
        with open(self.log_path, "w") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kubetune", "operator", *(f"--namespace={n}" for n in namespaces),
                 "--ray-address", self.ray_address, "--checkpoint-storage", str(self.workdir / "checkpoints"),
                 "--metrics-port", str(self.metrics_port), "--ingest-port", str(free_port()),
                 "--liveness", f"http://127.0.0.1:{self.health_port}/healthz", *election, *self.chart_switches()],
                env=env, stdout=log_file, stderr=subprocess.STDOUT)
        wait_for(lambda: self.process.poll() is not None
                 or http_get(f"http://127.0.0.1:{self.health_port}/healthz")[0] == 200,
                 timeout=60, message="the operator's liveness endpoint")
        assert self.process.poll() is None, "the operator exited:\n" + self.log()[-5000:]

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process)

    @contextlib.contextmanager
    def running(self, namespaces: list[str]):
        """Started for ``namespaces``, stopped at the end; its log is printed if the block fails."""
        try:
            self.start(namespaces)
            yield self
        except BaseException:
            print(self.log()[-8000:])
            raise
        finally:
            self.stop()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def assert_no_permission_problem(self) -> None:
        log = self.log()
        assert self.process.poll() is None, log[-5000:]
        # kopf: APIForbiddenError(... status=403) / "Not enough permissions"; client: "(403) Reason: Forbidden"
        problem = re.search(r"forbidden|not enough permissions|\(403\)|status=403", log, re.IGNORECASE)
        assert problem is None, f"{problem.group(0)!r} in the operator log:\n{log[-5000:]}"


def assert_forbidden(username: str, *calls) -> None:
    for call in calls:
        with pytest.raises(ApiException) as info:
            call()
        assert info.value.status == 403, info.value.body
        assert username in json.loads(info.value.body)["message"]


def run_experiment_through(operator: ChartOperator, admin_client, sa_client, namespace: str) -> None:
    """A whole small Experiment as a user sees it (kubectl wait, Events), as the
    operator counts it (/metrics), deleted through kopf's finalizer at the end."""
    admin = client.CustomObjectsApi(admin_client)
    review = client.AuthenticationV1Api(sa_client).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    assert review.status.user_info.username == operator.username   # really the ServiceAccount

    # 3 trials of 2 GPUs on a 4-GPU Ray, 3 at a time allowed: the third waits for room
    body = experiment("rbac", budget={"maxTrials": 3, "parallelism": 3},
                      trial={"resources": {"cpu": 0.1, "gpu": 2}, "config": {"iterations": 3, "delay": 0.3}})
    create(admin, namespace, body)
    # `kubectl wait --for=condition=Succeeded experiment/rbac`
    done = wait_for_condition(admin, GROUP, VERSION, namespace, "experiments", "rbac", "Succeeded", timeout=90)
    assert done["status"]["phase"] == "Succeeded"
    assert done["status"]["trialCounts"]["succeeded"] == 3
    assert [t["status"]["phase"] for t in trials(admin, namespace, "rbac")] == ["Succeeded"] * 3
    # stripping a finished Trial's managedFields is within the chart's permissions (trials: patch)
    wait_for(lambda: not any(t["metadata"].get("managedFields") for t in trials(admin, namespace, "rbac")),
             timeout=30, message="the finished Trials' managedFields stripped")

    # Events on the Experiment: launches, queueing, completion
    core = client.CoreV1Api(admin_client)

    def reasons():
        items = core.list_namespaced_event(namespace, field_selector="involvedObject.name=rbac").items
        return [e.reason for e in items if e.involved_object.kind == "Experiment"]
    wait_for(lambda: {"TrialLaunched", "TrialsQueued", "MaxTrialsReached"} <= set(reasons()),
             timeout=30, message=f"the Experiment's Events (so far {reasons()})")
    assert reasons().count("TrialLaunched") == 3

    # /metrics shows the finished experiment
    samples = scrape(operator.metrics_port)
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
    assert metric(samples, "kubetune_ray_connected", address=operator.ray_address) == 1

    # deletion goes through kopf's finalizer: also within the permissions
    admin.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "rbac")

    wait_for(lambda: experiment_gone(admin, namespace, "rbac"), timeout=30,
             message="the Experiment's finalizer to be removed by the operator")


def applied_again_after_an_orphaning_delete(admin, namespace: str) -> None:
    """AUDIT N10: `kubectl delete experiment e --cascade=orphan`, then apply e again: its
    Trial e-0 is left without an owner, and only the operator can remove it (the
    garbage collector never will); the new Experiment runs once it has."""
    body = experiment("orphan", budget={"maxTrials": 1}, trial={"config": {"iterations": 1}})
    create(admin, namespace, body)
    wait_for_condition(admin, GROUP, VERSION, namespace, "experiments", "orphan", "Succeeded", timeout=90)
    old = trials(admin, namespace, "orphan")[0]["metadata"]["uid"]
    admin.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "orphan",
                                          body={"propagationPolicy": "Orphan"})
    wait_for(lambda: experiment_gone(admin, namespace, "orphan"), timeout=30, message="the orphaning delete")
    create(admin, namespace, body)
    done = wait_for_condition(admin, GROUP, VERSION, namespace, "experiments", "orphan", "Succeeded", timeout=90)
    [trial] = trials(admin, namespace, "orphan")
    assert trial["metadata"]["uid"] != old and trial["metadata"]["ownerReferences"][0]["uid"] == \
        done["metadata"]["uid"]
    admin.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "orphan")
    wait_for(lambda: experiment_gone(admin, namespace, "orphan"), timeout=30, message="the Experiment deleted")


def test_operator_runs_an_experiment_with_only_the_chart_permissions(
        helm, kube_cluster, ray_local, namespace, home_namespace, tmp_path):
    """watchNamespaces: [<ns>] -> a Role in <ns> bound to the account in the chart's own
    namespace; the operator serves <ns> and can do nothing elsewhere."""
    operator = ChartOperator(helm, kube_cluster, ray_local, tmp_path, release="kt", home=home_namespace,
                             values={"watchNamespaces": [namespace]})
    with kube_cluster.api_client() as admin_client:
        applied = operator.install(admin_client)
        assert {a["kind"] for a in applied} >= {"CustomResourceDefinition", "ServiceAccount", "Role",
                                                "RoleBinding", "Deployment", "Service"}
        assert not {a["kind"] for a in applied} & {"ClusterRole", "ClusterRoleBinding"}
        # the server kept the fields the chart sets, under our field manager
        deployment = next(a for a in applied if a["kind"] == "Deployment")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
        assert FIELD_MANAGER in {m["manager"] for m in deployment["metadata"]["managedFields"]}

        with config.new_client_from_config(config_file=str(operator.kubeconfig)) as sa_client, \
                operator.running([namespace]):
            run_experiment_through(operator, admin_client, sa_client, namespace)
            applied_again_after_an_orphaning_delete(client.CustomObjectsApi(admin_client), namespace)
            sa_core, sa_custom = client.CoreV1Api(sa_client), client.CustomObjectsApi(sa_client)
            assert_forbidden(
                operator.username,
                lambda: sa_core.list_namespaced_secret(namespace),
                lambda: sa_core.read_namespaced_secret("anything", namespace),
                lambda: sa_custom.list_namespaced_custom_object(GROUP, VERSION, home_namespace, "experiments"),
                lambda: sa_custom.list_cluster_custom_object(GROUP, VERSION, "experiments"),
                lambda: sa_core.list_namespace())
            operator.assert_no_permission_problem()


@pytest.fixture
def private_cluster(kube_cluster, tmp_path_factory):
    """A control plane of its own, with no CRDs until the chart brings them: a
    cluster-wide operator here sees nothing of the other tests' namespaces."""
    if kube_cluster.plane is None:
        pytest.skip("needs the embedded control plane (KUBETUNE_TEST_KUBECONFIG names a shared cluster)")
    plane = ControlPlane(tmp_path_factory.mktemp("chart-plane"), install_crds=False, die_with_parent=True,
                         log=lambda message: None)
    try:
        plane.start()
        yield KubeCluster(plane.kubeconfig, plane)
    finally:
        plane.stop()


def test_cluster_wide_install_runs_an_experiment_in_any_namespace(helm, private_cluster, ray_local, tmp_path):
    """watchNamespaces: [] -> the same rules as a ClusterRole; the operator (no
    --namespace: kopf cluster-wide) serves a namespace the chart never named."""
    with private_cluster.api_client() as admin_client:
        core = client.CoreV1Api(admin_client)
        for name in ("kubetune-system", "team-a"):
            core.create_namespace({"metadata": {"name": name}})
        operator = ChartOperator(helm, private_cluster, ray_local, tmp_path, release="kt", home="kubetune-system",
                                 values={})
        applied = operator.install(admin_client)
        [role] = [a for a in applied if a["kind"] == "ClusterRole"]
        assert role["rules"] == next(d for d in operator.documents if d["kind"] == "ClusterRole")["rules"]
        # no namespaced permissions but the Lease of leader election, in the release namespace
        assert [(a["metadata"]["name"], a["metadata"]["namespace"]) for a in applied if a["kind"] == "Role"] == [
            ("kt-kubetune-leader", "kubetune-system")]
        # the KubeRay example's Experiment is accepted by the CRDs the chart installed
        example = yaml.safe_load((REPO / "examples" / "kuberay" / "experiment.yaml").read_text())
        client.CustomObjectsApi(admin_client).create_namespaced_custom_object(
            GROUP, VERSION, "team-a", "experiments", example, dry_run="All")

        with config.new_client_from_config(config_file=str(operator.kubeconfig)) as sa_client, \
                operator.running([]):
            run_experiment_through(operator, admin_client, sa_client, "team-a")
            sa_core, sa_custom = client.CoreV1Api(sa_client), client.CustomObjectsApi(sa_client)
            sa_custom.list_cluster_custom_object(GROUP, VERSION, "experiments")   # allowed everywhere
            assert_forbidden(
                operator.username,
                lambda: sa_core.list_secret_for_all_namespaces(),
                lambda: sa_core.read_namespaced_secret("anything", "team-a"),
                lambda: sa_custom.delete_collection_namespaced_custom_object(GROUP, VERSION, "team-a",
                                                                            "experiments"),
                lambda: sa_core.list_namespace(),
                lambda: client.ApiextensionsV1Api(sa_client).list_custom_resource_definition())
            operator.assert_no_permission_problem()
