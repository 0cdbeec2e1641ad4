"""Trial pods are held to the restricted Pod Security profile unless allowed
(spec/pod_policy.py), and rendered with its settings where the template says nothing."""
from __future__ import annotations

import pytest

from kubetune.executors.pods import spec as pod_spec
from kubetune.spec import pod_policy


def template(**spec) -> dict:
    return {"spec": {"containers": [{"name": "train", "image": "x"}], **spec}}


ESCAPES = [
    (template(hostNetwork=True), "hostNamespaces", "spec.trial.template.spec.hostNetwork"),
    (template(hostPID=True), "hostNamespaces", "spec.trial.template.spec.hostPID"),
    (template(hostIPC=True), "hostNamespaces", "spec.trial.template.spec.hostIPC"),
    (template(volumes=[{"name": "root", "hostPath": {"path": "/"}}]), "hostPath",
     "spec.trial.template.spec.volumes[0].hostPath"),
    (template(volumes=[{"name": "n", "nfs": {"server": "s", "path": "/"}}]), "volumeTypes",
     "spec.trial.template.spec.volumes[0].nfs"),
    (template(containers=[{"name": "t", "securityContext": {"privileged": True}}]), "privileged",
     "spec.trial.template.spec.containers[0].securityContext.privileged"),
    (template(initContainers=[{"name": "i", "securityContext": {"allowPrivilegeEscalation": True}}]),
     "privileged", "spec.trial.template.spec.initContainers[0].securityContext.allowPrivilegeEscalation"),
    (template(containers=[{"name": "t", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]),
     "capabilities", "spec.trial.template.spec.containers[0].securityContext.capabilities.add"),
    (template(containers=[{"name": "t", "ports": [{"containerPort": 80, "hostPort": 80}]}]), "hostPorts",
     "spec.trial.template.spec.containers[0].ports[0].hostPort"),
    (template(securityContext={"runAsUser": 0}), "runAsRoot", "spec.trial.template.spec.securityContext.runAsUser"),
    (template(securityContext={"seccompProfile": {"type": "Unconfined"}}), "seccompUnconfined",
     "spec.trial.template.spec.securityContext.seccompProfile"),
    (template(securityContext={"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "1"}]}), "sysctls",
     "spec.trial.template.spec.securityContext.sysctls"),
    (template(serviceAccountName="operator-admin"), "serviceAccount",
     "spec.trial.template.spec.serviceAccountName"),
    (template(nodeName="control-plane-0"), "nodeName", "spec.trial.template.spec.nodeName"),
    ({**template(), "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/train": "unconfined"}}},
     "privileged", "spec.trial.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/train]"),
]


@pytest.mark.parametrize("body, allowance, field", ESCAPES, ids=[e[2].rsplit(".", 1)[1][:40] for e in ESCAPES])
def test_each_escape_is_refused_naming_its_field_unless_allowed(body, allowance, field):
    [message] = pod_policy.violations(body)
    assert message.startswith(field + ":") and f"--pod-allow={allowance}" in message
    assert f"pod-security.kubetune.dev/allow-{allowance}=true" in message
    assert pod_policy.violations(body, {allowance}) == []
    assert set(pod_policy.ALLOWANCES) >= {allowance}


def test_a_plain_template_and_the_namespace_default_account_pass():
    assert pod_policy.violations(template(serviceAccountName="default",
                                          volumes=[{"name": "d", "emptyDir": {}}])) == []


def test_a_namespace_opts_in_by_label_only_to_known_allowances():
    labels = {"pod-security.kubetune.dev/allow-hostPath": "true", "pod-security.kubetune.dev/allow-privileged": "no",
              "pod-security.kubetune.dev/allow-everything": "true", "team": "a"}
    assert pod_policy.namespace_allowances(labels) == {"hostPath"}


def test_rendered_pods_get_the_restricted_defaults_and_keep_what_the_template_sets():
    body = {"spec": {"containers": [{"name": "a", "image": "x"},
                                    {"name": "b", "image": "x", "securityContext": {
                                        "allowPrivilegeEscalation": True, "capabilities": {"drop": ["NET_RAW"]}}}],
                     "automountServiceAccountToken": True}}
    pod = pod_spec.render_pod(body, namespace="ns", experiment="e", trial="e-0", trial_uid="u", attempt=0,
                              params={}, env={})
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is True          # the template asked
    assert spec["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    first, second = spec["containers"]
    assert first["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert second["securityContext"] == {"allowPrivilegeEscalation": True,
                                         "capabilities": {"drop": ["NET_RAW", "ALL"]}}
    plain = pod_spec.render_pod({"spec": {"containers": [{"name": "a"}]}}, namespace="ns", experiment="e",
                                trial="e-0", trial_uid="u", attempt=0, params={}, env={})
    assert plain["spec"]["automountServiceAccountToken"] is False


def test_allowed_root_and_privileged_templates_get_no_contradicting_default():
    body = {"spec": {"securityContext": {"runAsUser": 0},
                     "containers": [{"name": "a", "securityContext": {"privileged": True}}]}}
    spec = pod_policy.restricted_defaults(body["spec"])
    assert "runAsNonRoot" not in spec["securityContext"]
    assert "allowPrivilegeEscalation" not in spec["containers"][0]["securityContext"]


def test_parameters_sharing_an_environment_variable_are_refused_defensively():
    with pytest.raises(pod_spec.PodSpecError, match="'a-b' and 'a_b' are both passed as KUBETUNE_PARAM_A_B"):
        pod_spec.render_pod({"spec": {"containers": [{"name": "a"}]}}, namespace="ns", experiment="e",
                            trial="e-0", trial_uid="u", attempt=0, params={"a-b": 1, "a_b": 2}, env={})


def test_the_template_metadata_cannot_reach_kueue_nor_relax_apparmor():
    """Labels and annotations of the template: Kueue's (priority class, queue, pod group)
    are the operator's to set from spec.queue/spec.priorityClass, whatever is allowed; an
    AppArmor annotation other than runtime/default or localhost/<profile> is privileged."""
    for part in ("labels", "annotations"):
        body = {**template(), "metadata": {part: {"kueue.x-k8s.io/priority-class": "cluster-critical"}}}
        [message] = pod_policy.violations(body, set(pod_policy.ALLOWANCES))
        assert message.startswith(f"spec.trial.template.metadata.{part}[kueue.x-k8s.io/priority-class]:")
    for value in ("runtime/default", "localhost/trainer"):
        body = {**template(), "metadata": {"annotations": {
            "container.apparmor.security.beta.kubernetes.io/train": value}}}
        assert pod_policy.violations(body) == []
    body = {**template(), "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/t": "x"}}}
    assert len(pod_policy.violations(body)) == 1


def test_only_the_priority_classes_the_operator_names_may_be_asked_for():
    assert pod_policy.priority_class_violations(None, ()) == []
    assert pod_policy.priority_class_violations("tuning-low", {"tuning-low"}) == []
    [message] = pod_policy.priority_class_violations("cluster-critical", {"tuning-low", "tuning-high"})
    assert message.startswith("spec.priorityClass:") and "tuning-high, tuning-low" in message
    assert "--pod-priority-classes" in message
    [message] = pod_policy.priority_class_violations("tuning-low", ())
    assert "allowed: none" in message
