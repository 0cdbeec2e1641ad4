"""charts/kubetune with ``dashboard.enabled``: what `helm template` renders, checked
against the CLI that runs it and against the real API server (server-side dry-run).
The Deployment runs on the real node in test_real_node.py."""
from __future__ import annotations

import pytest
from kubernetes import client, dynamic

from kube_fixtures import temporary_namespace
from test_chart import by_kind, helm, render, run_helm, CHART  # noqa: F401  (helm: the fixture)

pytestmark = pytest.mark.integration
ON = {"dashboard": {"enabled": True}}


def dashboard_of(kinds: dict) -> tuple[dict, dict]:
    [deployment] = [d for d in kinds["Deployment"] if d["metadata"]["name"].endswith("-dashboard")]
    [operator] = [d for d in kinds["Deployment"] if not d["metadata"]["name"].endswith("-dashboard")]
    return deployment, operator


def test_off_by_default(helm, tmp_path):
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", {}))
    assert not any(d["metadata"]["name"].endswith("-dashboard") for docs in kinds.values() for d in docs)
    _, operator = dashboard_of({"Deployment": kinds["Deployment"] + [{"metadata": {"name": "x-dashboard"}}]})
    assert not any(a.startswith("--dashboard-url") for a in operator["spec"]["template"]["spec"]["containers"][0]["args"])


def test_sqlite_store_is_mounted_read_only_on_the_operators_node_with_no_rights(helm, tmp_path):
    from kubetune import cli
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system",
                           {"dashboard": {"enabled": True, "baseURL": "https://tuning.example.com"}}))
    deployment, operator = dashboard_of(kinds)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # its own ServiceAccount: no token, bound to nothing
    [account] = [a for a in kinds["ServiceAccount"] if a["metadata"]["name"] == "kt-kubetune-dashboard"]
    assert account["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "kt-kubetune-dashboard"
    bindings = kinds.get("ClusterRoleBinding", []) + kinds.get("RoleBinding", [])
    assert not any(s["name"] == "kt-kubetune-dashboard" for b in bindings for s in b["subjects"])
    # the operator's SQLite volume, read-only twice (the claim and the mount)
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/var/lib/kubetune"]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": "kt-kubetune-results", "readOnly": True}
    # ReadWriteOnce: on the operator's node
    [term] = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["labelSelector"]["matchLabels"] == operator["spec"]["selector"]["matchLabels"]
    # neither selects the other's pods (the operator's Services reach the operator only)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert not set(operator["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())
    [service] = [s for s in kinds["Service"] if s["metadata"]["name"] == "kt-kubetune-dashboard"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for other in kinds["Service"]:
        if other is not service:
            assert not set(other["spec"]["selector"].items()) <= set(labels.items())
    # the command it runs is `kubetune dashboard` with flags that CLI takes
    assert container["command"] == ["kubetune", "dashboard"]
    args = cli.build_parser().parse_args(["dashboard", *container["args"]])
    assert (args.host, args.port, args.store, args.wait_for_store) == (
        "0.0.0.0", 8080, "sqlite:////var/lib/kubetune/results.db", True)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # each study's page data on a volume of its own (kept across container restarts), bounded
    [cache] = [m for m in container["volumeMounts"] if m["mountPath"] == args.cache_dir]
    assert args.cache_size == 1024 and volumes[cache["name"]]["emptyDir"] == {"sizeLimit": "2048Mi"}
    # ready once every study's page data is there (a rolling update keeps the old Pod until then)
    from kubetune.dashboard.server import READY_ROUTE
    assert container["readinessProbe"]["httpGet"] == {"path": READY_ROUTE, "port": "http"}
    # the operator names each Experiment's page: --dashboard-url, a valid setting
    from kubetune.settings import from_args
    operator_args = cli.build_parser().parse_args(
        ["operator", *operator["spec"]["template"]["spec"]["containers"][0]["args"]])
    assert from_args(operator_args).dashboard_url == "https://tuning.example.com"


def test_postgres_store_comes_from_the_same_secret(helm, tmp_path):
    values = {**ON, "results": {"postgres": {"urlSecretRef": {"name": "kubetune-db"}}}}
    kinds = by_kind(render(helm, tmp_path, "kt", "kubetune-system", values))
    deployment, _ = dashboard_of(kinds)
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["KUBETUNE_RESULTS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "kubetune-db", "key": "url"}}
    assert not any(a.startswith("--store") for a in container["args"])      # a password never in args
    assert "affinity" not in pod and "/var/lib/kubetune" not in {m["mountPath"] for m in container["volumeMounts"]}


def test_an_ephemeral_sqlite_store_is_refused_with_the_fix(helm, tmp_path):
    result = run_helm(helm, "template", "kt", str(CHART), "--set", "dashboard.enabled=true",
                      "--set", "results.sqlite.persistence.enabled=false")
    assert result.returncode != 0 and "results.sqlite.persistence.enabled=true" in result.stderr
    bad = run_helm(helm, "template", "kt", str(CHART), "--set", "dashboard.enabled=true",
                   "--set", "dashboard.baseURL=tuning.example.com")
    assert bad.returncode != 0 and "baseURL" in bad.stderr


def test_the_api_server_accepts_every_object(helm, tmp_path, kube_cluster):
    """Server-side dry-run of the rendered dashboard objects (schema, defaults, admission)."""
    with temporary_namespace(kube_cluster, "kt-dash-") as namespace, kube_cluster.api_client() as api:
        documents = render(helm, tmp_path, "kt", namespace, ON)
        dashboard = [d for d in documents if d["metadata"]["name"].endswith("-dashboard")]
        assert {d["kind"] for d in dashboard} == {"ServiceAccount", "Deployment", "Service"}
        dyn = dynamic.DynamicClient(api)
        for document in dashboard:
            resource = dyn.resources.get(api_version=document["apiVersion"], kind=document["kind"])
            applied = dyn.server_side_apply(resource, body=document, namespace=namespace,
                                            field_manager="kubetune-chart-test", dry_run="All").to_dict()
            assert applied["metadata"]["name"] == document["metadata"]["name"]
        assert not client.AppsV1Api(api).list_namespaced_deployment(namespace).items   # a dry run: nothing made
