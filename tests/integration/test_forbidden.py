"""Issue 14: a missing permission is a Failed condition that names it, not a silent
loop.  The chart installed with ``podExecutor.enabled`` but a Role missing its rules
on Pods, and the operator running with nothing but its ServiceAccount's token
(test_chart.ChartOperator): a pod Experiment cannot list or create Pods there."""
from __future__ import annotations

import pytest
from kubernetes import client

from k8s_helpers import condition, create, get_experiment, wait_condition
from test_chart import ChartOperator, helm, home_namespace  # noqa: F401 (fixtures)
from test_pods import pod_experiment

pytestmark = pytest.mark.integration


def test_a_pod_experiment_without_pod_rbac_is_failed_naming_the_permission(
        helm, kube_cluster, namespace, home_namespace, tmp_path):
    operator = ChartOperator(helm, kube_cluster, "local", tmp_path, release="kt", home=home_namespace,
                             values={"watchNamespaces": [namespace], "podExecutor": {"enabled": True}})
    # the pod executor switched on, but its Role without the rules on Pods: RBAC an
    # administrator got wrong, refused by the real API server
    for document in operator.documents:
        if document["kind"] == "Role":
            document["rules"] = [rule for rule in document["rules"] if "pods" not in rule.get("resources", ())]
    with kube_cluster.api_client() as admin_client:
        operator.install(admin_client)
        custom = client.CustomObjectsApi(admin_client)
        with operator.running([namespace]):
            create(custom, namespace, pod_experiment("norbac", budget={"maxTrials": 1}))
            failed = wait_condition(custom, namespace, "norbac", "Failed", timeout=90)
            reason = condition(failed, "Failed")
            assert failed["status"]["phase"] == "Failed"
            assert reason["reason"] == "Forbidden"
            assert 'cannot list resource "pods"' in reason["message"] and operator.username in reason["message"]
            assert len(reason["message"].encode()) <= 1024
            # the loop goes on, with backoff: the operator is alive and still answers
            assert operator.process.poll() is None
            assert get_experiment(custom, namespace, "norbac")["status"]["phase"] == "Failed"
