"""charts/kubetune with ``podExecutor.enabled``: what it renders, and a pod Experiment
run by the operator with nothing but the chart's ServiceAccount token (as in
test_chart.py), on the kube-scheduler + kwok cluster of pod_fixtures.

The test plays the trial containers (test_pods.Container); the operator, as the
ServiceAccount, creates each trial's Pod, Secret and ConfigMap, lists Pods and the
cluster autoscaler's Events, reads a failed pod's log and deletes Pods.
"""
from __future__ import annotations

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from k8s_helpers import GROUP, VERSION, create, experiment_gone, trials, wait_condition
from kube_fixtures import temporary_namespace, wait_for
from test_chart import (CHART, ChartOperator, assert_forbidden, by_kind, helm,  # noqa: F401 (helm: fixture)
                        render, run_helm)
from test_pods import Container, pod_experiment, pods_of

pytestmark = pytest.mark.integration

# exactly what executors/pods/executor.py (through k8s/pods.py) and the ingest endpoint call, on top of the Ray rules
POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": ["kubetune.dev"], "resources": ["trials/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},     # podSecurity.namespaceOptIn
]
POD_RESOURCES = {"pods", "pods/log", "secrets", "configmaps"}


def operator_container(kinds: dict) -> dict:
    [deployment] = kinds["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


# ------------------------------------------------------------------ helm template

def test_pod_executor_is_off_by_default(helm, tmp_path):
    for values in ({}, {"watchNamespaces": ["team-a"]}):
        kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))
        for role in kinds.get("ClusterRole", []) + kinds.get("Role", []):
            assert not any(set(r["resources"]) & POD_RESOURCES for r in role["rules"]), role["rules"]
            assert not any("trials/finalizers" in r["resources"] for r in role["rules"])
        assert [s["metadata"]["name"] for s in kinds["Service"]] == ["kt-kubetune-metrics"]
        container = operator_container(kinds)
        assert not any(a.startswith(("--ingest-port", "--ingest-url", "--pod-")) for a in container["args"])
        # the search-space size policy is always there; the pod-security one only with pods
        assert [p["metadata"]["name"] for p in kinds["ValidatingAdmissionPolicy"]] == \
            ["kt-kubetune-search-space-size"]
        assert {p["name"] for p in container["ports"]} == {"metrics", "health"}


def test_pod_executor_rights_are_cluster_wide_only_when_asked_for(helm, tmp_path):
    """Least privilege by default: with every namespace served, the pod executor's rights
    to Pods and Secrets would be cluster-wide; the chart refuses that unless clusterWide."""
    values = tmp_path / "values.yaml"
    values.write_text("podExecutor: {enabled: true}\n")
    result = run_helm(helm, "template", "kt", str(CHART), "--namespace", "kubetune-system", "-f", str(values))
    assert result.returncode != 0 and "podExecutor.clusterWide=true" in result.stderr
    assert "watchNamespaces" in result.stderr


def test_the_ingest_is_reachable_from_trial_pods_only(helm, tmp_path):
    values = {"watchNamespaces": ["team-a"], "podExecutor": {"enabled": True, "ingestPort": 9091}}
    [policy] = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))["NetworkPolicy"]
    ingest, rest = policy["spec"]["ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "kt"
    assert ingest["ports"] == [{"protocol": "TCP", "port": 9091}]
    [source] = ingest["from"]
    assert source["podSelector"] == {"matchExpressions": [{"key": "kubetune.dev/experiment", "operator": "Exists"}]}
    assert source["namespaceSelector"]["matchExpressions"][0]["values"] == ["team-a"]
    # every other port stays open (metrics, health, a Ray driver's callbacks)
    assert "from" not in rest and {"protocol": "TCP", "port": 1, "endPort": 9090} in rest["ports"]
    assert {"protocol": "TCP", "port": 9092, "endPort": 65535} in rest["ports"]
    values["podExecutor"]["ingestNetworkPolicy"] = {"enabled": False}
    assert "NetworkPolicy" not in by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))


def test_pod_executor_cluster_wide_adds_its_rules_service_and_wiring(helm, tmp_path):
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system",
                           {"podExecutor": {"enabled": True, "clusterWide": True}}))
    [role] = kinds["ClusterRole"]
    assert role["rules"][-len(POD_RULES):] == POD_RULES
    assert [r["metadata"]["name"] for r in kinds["Role"]] == ["kt-kubetune-leader"]    # the Lease only
    [ingest] = [s for s in kinds["Service"] if s["metadata"]["name"] == "kt-kubetune-ingest"]
    assert ingest["metadata"]["namespace"] == "kubetune-system"
    assert ingest["spec"]["ports"] == [{"name": "ingest", "port": 8081, "targetPort": "ingest", "protocol": "TCP"}]
    assert ingest["spec"]["selector"] == kinds["Deployment"][0]["spec"]["selector"]["matchLabels"]
    container = operator_container(kinds)
    assert "--pod-executor" in container["args"] and "--pod-namespace-opt-in" in container["args"]
    assert not any(a.startswith("--pod-allow") for a in container["args"])
    assert "--ingest-port=8081" in container["args"]
    assert "--ingest-url=http://kt-kubetune-ingest.kubetune-system.svc:8081" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 8080, "health": 8082,
                                                                           "ingest": 8081}


def test_pod_executor_with_a_namespace_list_uses_roles_only(helm, tmp_path):
    values = {"watchNamespaces": ["team-a", "team-b"], "podExecutor": {"enabled": True, "ingestPort": 9091}}
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))
    # no ClusterRole at all, so none granting Secrets: the pod executor's rights are the Roles'
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    roles = [r for r in kinds["Role"] if r["metadata"]["name"] != "kt-kubetune-leader"]   # but the Lease's
    secret_rules = [r for role in roles for r in role["rules"] if "secrets" in r["resources"]]
    assert secret_rules and all(r["verbs"] == ["get", "create"] and "resourceNames" not in r for r in secret_rules)
    [binding] = [b for b in kinds["ValidatingAdmissionPolicyBinding"]
                 if b["metadata"]["name"] == "kt-kubetune-pod-security"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == \
        ["team-a", "team-b"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"][-len(POD_RULES):] == POD_RULES
        assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])
    [ingest] = [s for s in kinds["Service"] if s["metadata"]["name"] == "kt-kubetune-ingest"]
    assert ingest["spec"]["ports"][0]["port"] == 9091
    container = operator_container(kinds)
    assert "--ingest-port=9091" in container["args"]
    assert "--ingest-url=http://kt-kubetune-ingest.kubetune-system.svc:9091" in container["args"]
    assert {"name": "ingest", "containerPort": 9091, "protocol": "TCP"} in container["ports"]


def test_pod_security_allowances_reach_the_operator_and_the_admission_policy(helm, tmp_path):
    values = {"podExecutor": {"enabled": True, "clusterWide": True,
                              "podSecurity": {"allow": ["hostPath", "nodeName"], "namespaceOptIn": False}}}
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))
    args = operator_container(kinds)["args"]
    assert "--pod-allow=hostPath" in args and "--pod-allow=nodeName" in args
    assert "--pod-namespace-opt-in" not in args
    [role] = kinds["ClusterRole"]
    assert not any("namespaces" in r["resources"] for r in role["rules"])
    [policy] = [p for p in kinds["ValidatingAdmissionPolicy"] if p["metadata"]["name"] == "kt-kubetune-pod-security"]
    [allowed] = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "allowed"]
    assert allowed.strip() == '["hostPath","nodeName"]'


# ------------------------------------------------------------------ against the API server

@pytest.fixture
def home_namespace(gpu_cluster):
    """The chart's own namespace on the pod cluster (not a watched one)."""
    with temporary_namespace(gpu_cluster, "kt-chart-pods-") as name:
        yield name


def test_a_pod_experiment_runs_with_only_the_chart_permissions(helm, gpu_cluster, pod_namespace, home_namespace,
                                                                 tmp_path):
    ns = pod_namespace
    # no Ray: pod Experiments never start it
    operator = ChartOperator(helm, gpu_cluster, "local", tmp_path, release="ktp", home=home_namespace,
                             values={"watchNamespaces": [ns], "podExecutor": {"enabled": True}})
    with gpu_cluster.api_client() as admin_client:
        applied = operator.install(admin_client)
        assert {"Role", "RoleBinding", "Service"} <= {a["kind"] for a in applied}
        [role] = [a for a in applied if a["kind"] == "Role" and a["metadata"]["namespace"] == ns]
        assert role["metadata"]["namespace"] == ns and role["rules"][-len(POD_RULES):] == POD_RULES
        core, custom = client.CoreV1Api(admin_client), client.CustomObjectsApi(admin_client)
        with config.new_client_from_config(config_file=str(operator.kubeconfig)) as sa_client:
            sa_core = client.CoreV1Api(sa_client)
            review = client.AuthenticationV1Api(sa_client).create_self_subject_review(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
            assert review.status.user_info.username == operator.username
            refused_at_apply(core, custom, ns)
            with operator.running([ns]):
                run_pod_experiments(operator, core, custom, sa_core, ns, home_namespace, tmp_path)
                operator.assert_no_permission_problem()


def refused_at_apply(core, custom, ns: str) -> None:
    """The chart's ValidatingAdmissionPolicy: a privileged template is refused by the API
    server, naming the field; a namespace labelled to allow hostPath gets it through."""
    privileged = pod_experiment("privileged", budget={"maxTrials": 1})
    privileged["spec"]["trial"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}

    def refusal():
        try:
            create(custom, ns, privileged)
        except ApiException as error:
            return error
        custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "privileged")  # not active yet
        return None
    error = wait_for(refusal, timeout=30, interval=0.5, message="the admission policy in force")
    assert error.status == 403, error.body      # the policy's reason: Forbidden
    assert "spec.trial.template.spec.containers[train].securityContext.privileged: refused" in error.body

    host_path = pod_experiment("hostpath", budget={"maxTrials": 1})
    host_path["spec"]["trial"]["template"]["spec"]["volumes"] = [{"name": "n", "hostPath": {"path": "/"}}]
    with pytest.raises(ApiException, match=r"spec.trial.template.spec.volumes\[\].hostPath: refused"):
        create(custom, ns, host_path)
    label = "pod-security.kubetune.dev/allow-hostPath"
    core.patch_namespace(ns, {"metadata": {"labels": {label: "true"}}})
    try:
        wait_for(lambda: _created(custom, ns, host_path), timeout=30, interval=0.5,
                 message="the opted-in namespace's hostPath Experiment admitted")
        # as the operator's finalizer would be (an update keeping the template: always admitted)
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "hostpath",
                                              {"metadata": {"finalizers": ["kubetune.dev/finalizer"]}})
    finally:
        core.patch_namespace(ns, {"metadata": {"labels": {label: None}}})
    # AUDIT N9: the allowance withdrawn, the Experiment is deleted: its finalizer's removal
    # (an update the policy matched) must not be refused, or it stays Terminating for ever
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "hostpath")
    wait_for(lambda: _finalizer_removed(custom, ns, "hostpath"), timeout=30, interval=0.5,
             message="the finalizer of a no-longer-allowed Experiment removed")
    wait_for(lambda: experiment_gone(custom, ns, "hostpath"), timeout=30, message="the Experiment gone")

    # the template's metadata: Kueue's labels and an unconfined AppArmor annotation
    for name, metadata, refused in (
            ("kueuelabel", {"labels": {"kueue.x-k8s.io/priority-class": "cluster-critical"}}, "kueue.x-k8s.io/"),
            ("apparmor", {"annotations": {"container.apparmor.security.beta.kubernetes.io/train": "unconfined"}},
             "container.apparmor.security.beta.kubernetes.io/")):
        body = pod_experiment(name, budget={"maxTrials": 1})
        body["spec"]["trial"]["template"]["metadata"] = metadata
        with pytest.raises(ApiException, match=refused):
            create(custom, ns, body)


def _finalizer_removed(custom, ns: str, name: str) -> bool:
    try:
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, "experiments", name, {"metadata": {"finalizers": None}})
        return True
    except ApiException as error:
        if error.status == 404:
            return True
        assert error.status == 403, error.body
        return False


def _created(custom, ns: str, body: dict) -> bool:
    try:
        create(custom, ns, body)
        return True
    except ApiException as error:
        assert error.status == 403, error.body
        return False


def run_pod_experiments(operator: ChartOperator, core, custom, sa_core, ns: str, home: str, tmp_path) -> None:
    # 1. a failed first attempt, replaced; the second reaches maxIterations and its pod is deleted
    create(custom, ns, pod_experiment("chartpods", budget={"maxTrials": 1}, scheduler={"maxIterations": 2},
                                      trial={"maxFailures": 1, "resources": {"cpu": 0.1}}))
    first_pod = wait_for(lambda: next((p for p in pods_of(core, ns, "chartpods") if p.status.phase == "Running"),
                                      None), timeout=60, interval=0.2, message="the first attempt's pod")
    assert first_pod.metadata.name == "chartpods-0-a0"
    first = Container(core, first_pod, tmp_path)     # its Secret and ConfigMap exist: the operator made them
    first.session.report({"loss": 0.9})
    first.exit(1)
    second_pod = wait_for(lambda: next((p for p in pods_of(core, ns, "chartpods")
                                        if p.metadata.name == "chartpods-0-a1" and p.status.phase == "Running"),
                                       None), timeout=60, interval=0.2, message="the second attempt's pod")
    second = Container(core, second_pod, tmp_path)
    assert second.token == first.token
    second.session.report({"loss": 0.5})
    second.session.report({"loss": 0.4})
    wait_condition(custom, ns, "chartpods", "Succeeded", timeout=60)
    wait_for(lambda: [p.metadata.name for p in pods_of(core, ns, "chartpods")] == ["chartpods-0-a0"],
             timeout=30, interval=0.2, message="the running pod deleted, the failed one kept for its logs")
    [trial] = trials(custom, ns, "chartpods")
    assert [h["loss"] for h in trial["status"]["history"]] == [0.5, 0.4]
    assert "exited with code 1" in trial["status"]["failures"][0]["message"]

    # 2. a pod no node can hold: the Trial shows the scheduler's reason (pods and Events listed)
    create(custom, ns, pod_experiment("chartbig", budget={"maxTrials": 1}, trial={"resources": {"cpu": 0.1, "gpu": 3}}))

    def queued():
        found = trials(custom, ns, "chartbig")
        status = (found[0].get("status") or {}) if found else {}
        return status if status.get("phase") == "Queued" else None
    status = wait_for(queued, timeout=60, interval=0.2, message="the Trial Queued by the kube-scheduler")
    assert status["reason"] == "Unschedulable" and "Insufficient nvidia.com/gpu" in status["message"]
    custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "experiments", "chartbig")

    wait_for(lambda: experiment_gone(custom, ns, "chartbig"), timeout=30,
             message="the Experiment's finalizer removed by the operator")

    # 3. the rest of what the rules allow, called as the ServiceAccount: a pod's log (the
    # kubelet may have none, kwok: but the API server lets the request through) and a
    # ConfigMap patch (a PBT exploit's new parameters)
    try:
        sa_core.read_namespaced_pod_log("chartpods-0-a0", ns, tail_lines=5)
    except ApiException as error:
        assert error.status != 403, error.body
    params = sa_core.read_namespaced_config_map("chartpods-0-params", ns)
    sa_core.patch_namespaced_config_map("chartpods-0-params", ns, {"data": params.data})
    sa_core.read_namespaced_secret("chartpods-0-token", ns)
    sa_core.read_namespace(ns)      # a namespace's opt-in labels: its own Namespace object only

    # and nothing beyond them
    assert_forbidden(
        operator.username,
        lambda: sa_core.list_namespaced_secret(ns),
        lambda: sa_core.delete_namespaced_secret("chartpods-0-token", ns),
        lambda: sa_core.read_namespaced_pod("chartpods-0-a0", ns),
        lambda: sa_core.patch_namespaced_pod("chartpods-0-a0", ns, {"metadata": {"labels": {"x": "y"}}}),
        lambda: sa_core.list_namespaced_pod(home),
        lambda: sa_core.list_pod_for_all_namespaces(),
        lambda: sa_core.list_namespaced_config_map(home),
        lambda: sa_core.create_namespaced_secret(home, {"metadata": {"name": "x"}, "stringData": {"a": "b"}}),
        lambda: sa_core.read_namespace(home),
        lambda: sa_core.list_namespace(),
    )
