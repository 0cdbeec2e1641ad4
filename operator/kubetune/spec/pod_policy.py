"""What a trial pod may ask for (``spec.executor: pod``).  Pure: no I/O.

The operator creates trial pods with its own rights, so the right to create an
Experiment must not be worth more than the right to create a restricted Pod.  A
template is held to the Pod Security Standards "restricted" profile:

- refused (``violations``), each unless the operator or the namespace allows its
  *allowance*: privileged containers and other ways out of the container
  (``privileged``: privileged, allowPrivilegeEscalation true, procMount Unmasked,
  Windows hostProcess, SELinux user/role/type, AppArmor Unconfined in the field or
  the annotation), host namespaces
  (``hostNamespaces``), hostPath volumes (``hostPath``), hostPorts (``hostPorts``),
  added capabilities beyond NET_BIND_SERVICE (``capabilities``), running as root
  (``runAsRoot``), an Unconfined seccomp profile (``seccompUnconfined``), sysctls
  (``sysctls``), volume types outside the restricted list (``volumeTypes``), a
  serviceAccountName other than the namespace's ``default`` (``serviceAccount``),
  and ``nodeName``, which skips the scheduler (``nodeName``);
- defaulted (``restricted_defaults``) where the template says nothing: runAsNonRoot,
  seccomp RuntimeDefault, allowPrivilegeEscalation false, capabilities drop ALL,
  automountServiceAccountToken false.

Where kubetune differs from "restricted": it refuses every sysctl (restricted allows
a safe list) and any serviceAccountName or nodeName (restricted does not look at
either), and it defaults what restricted only requires.  Allowances come from the
operator (``--pod-allow``, the chart's ``podExecutor.podSecurity.allow``) or from the
trial's namespace, labelled ``pod-security.kubetune.dev/allow-<allowance>: "true"``.
"""
from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping

ALLOWANCES = ("privileged", "hostNamespaces", "hostPath", "hostPorts", "capabilities", "runAsRoot",
              "seccompUnconfined", "sysctls", "volumeTypes", "serviceAccount", "nodeName")
NAMESPACE_LABEL_PREFIX = "pod-security.kubetune.dev/allow-"
KUEUE_PREFIX = "kueue.x-k8s.io/"
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
TEMPLATE_PATH = "spec.trial.template.spec"

# the volume types the "restricted" profile allows (hostPath has an allowance of its own)
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
_CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")


def unknown_allowances(names: Iterable[str]) -> list[str]:
    return sorted(set(names) - set(ALLOWANCES))


def namespace_allowances(labels: Mapping[str, str] | None) -> set[str]:
    """The allowances a namespace opted in to by label."""
    return {key[len(NAMESPACE_LABEL_PREFIX):] for key, value in (labels or {}).items()
            if key.startswith(NAMESPACE_LABEL_PREFIX) and str(value).lower() == "true"} & set(ALLOWANCES)


def violations(template: Mapping[str, Any] | None, allowed: Iterable[str] = ()) -> list[str]:
    """What the template asks for that is not allowed, each naming its field and the way to allow it."""
    spec = (template or {}).get("spec") or {}
    allowed = set(allowed)
    found: list[tuple[str, str, str]] = []    # (allowance, field, what)

    for name in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(name):
            found.append(("hostNamespaces", name, "the host's namespaces"))
    account = spec.get("serviceAccountName") or spec.get("serviceAccount")
    if account and account != "default":
        field = "serviceAccountName" if spec.get("serviceAccountName") else "serviceAccount"
        found.append(("serviceAccount", field, f"ServiceAccount {account!r} (trial pods run as 'default')"))
    if spec.get("nodeName"):
        found.append(("nodeName", "nodeName", "a node chosen past the scheduler"))
    found += _context_violations(spec.get("securityContext") or {}, "securityContext", pod=True)
    for index, volume in enumerate(spec.get("volumes") or []):
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind == "hostPath":
                found.append(("hostPath", f"volumes[{index}].hostPath", "a directory of the node"))
            elif kind not in RESTRICTED_VOLUME_TYPES:
                found.append(("volumeTypes", f"volumes[{index}].{kind}",
                              f"volume type {kind} (allowed: {', '.join(sorted(RESTRICTED_VOLUME_TYPES))})"))
    for kind in _CONTAINER_KINDS:
        for index, container in enumerate(spec.get(kind) or []):
            where = f"{kind}[{index}]"
            for port_index, port in enumerate(container.get("ports") or []):
                if port.get("hostPort"):
                    found.append(("hostPorts", f"{where}.ports[{port_index}].hostPort", "a port of the node"))
            found += _context_violations(container.get("securityContext") or {}, f"{where}.securityContext")
    refused = [f"{TEMPLATE_PATH}.{field}: {what} is refused for trial pods; {_how_to_allow(allowance)}"
               for allowance, field, what in found if allowance not in allowed]
    return _metadata_violations((template or {}).get("metadata") or {}, allowed) + refused


def _metadata_violations(meta: Mapping[str, Any], allowed: set[str]) -> list[str]:
    """The template's labels and annotations: the fields pod security reads there (the
    AppArmor annotation, which a runtime honours like the field), and Kueue's, which
    would pick the trial's queue or priority past spec.queue and spec.priorityClass."""
    found = []
    for part in ("labels", "annotations"):
        for key in (meta.get(part) or {}):
            if str(key).startswith(KUEUE_PREFIX):
                found.append(f"spec.trial.template.metadata.{part}[{key}]: Kueue's {part} are set by the operator "
                             "from spec.queue and spec.priorityClass, never by the template")
    if "privileged" not in allowed:
        for key, value in (meta.get("annotations") or {}).items():
            if str(key).startswith(APPARMOR_ANNOTATION) and not _restricted_apparmor(str(value)):
                found.append(f"spec.trial.template.metadata.annotations[{key}]: AppArmor profile {value!r} is "
                             f"refused for trial pods (allowed: runtime/default, localhost/<profile>); "
                             f"{_how_to_allow('privileged')}")
    return found


def _restricted_apparmor(value: str) -> bool:
    return value in ("", "runtime/default") or (value.startswith("localhost/") and len(value) > len("localhost/"))


def priority_class_violations(name: str | None, allowed: Iterable[str]) -> list[str]:
    """A Kueue WorkloadPriorityClass the operator does not allow (it can preempt other
    teams' workloads in a cohort): each team gets only the classes the platform named."""
    allowed = sorted(set(allowed))
    if not name or name in allowed:
        return []
    return [f"spec.priorityClass: WorkloadPriorityClass {name!r} is not one this operator allows "
            f"(allowed: {', '.join(allowed) or 'none'}); the operator's --pod-priority-classes "
            "(chart value podExecutor.kueue.priorityClasses) names them"]


def _context_violations(context: Mapping[str, Any], where: str, pod: bool = False) -> list[tuple[str, str, str]]:
    found = []
    if not pod:
        if context.get("privileged"):
            found.append(("privileged", f"{where}.privileged", "a privileged container"))
        if context.get("allowPrivilegeEscalation") is True:
            found.append(("privileged", f"{where}.allowPrivilegeEscalation", "privilege escalation"))
        if context.get("procMount") not in (None, "Default"):
            found.append(("privileged", f"{where}.procMount", "an unmasked /proc"))
        added = set((context.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            found.append(("capabilities", f"{where}.capabilities.add", f"capabilities {', '.join(sorted(added))}"))
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(("privileged", f"{where}.windowsOptions.hostProcess", "a Windows host process"))
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("user") or selinux.get("role") or selinux.get("type", "") not in _SELINUX_TYPES:
        found.append(("privileged", f"{where}.seLinuxOptions", "a custom SELinux user, role or type"))
    if (context.get("appArmorProfile") or {}).get("type") == "Unconfined":
        found.append(("privileged", f"{where}.appArmorProfile", "an Unconfined AppArmor profile"))
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append(("seccompUnconfined", f"{where}.seccompProfile", "an Unconfined seccomp profile"))
    if context.get("runAsNonRoot") is False:
        found.append(("runAsRoot", f"{where}.runAsNonRoot", "running as root"))
    if context.get("runAsUser") == 0:
        found.append(("runAsRoot", f"{where}.runAsUser", "running as root (user 0)"))
    if pod and context.get("sysctls"):
        found.append(("sysctls", f"{where}.sysctls", "kernel parameters (sysctls)"))
    return found


def _how_to_allow(allowance: str) -> str:
    return (f"allowed only by the operator's --pod-allow={allowance} (chart value podExecutor.podSecurity.allow: "
            f"[{allowance}]) or the namespace label {NAMESPACE_LABEL_PREFIX}{allowance}=true")


def restricted_defaults(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """``pod_spec`` with the restricted profile's settings wherever it says nothing."""
    spec = copy.deepcopy(dict(pod_spec))
    spec.setdefault("automountServiceAccountToken", False)
    context = spec.setdefault("securityContext", {})
    contexts = [(c.get("securityContext") or {}) for kind in _CONTAINER_KINDS for c in spec.get(kind) or []]
    as_root = context.get("runAsUser") == 0 or any(c.get("runAsUser") == 0 for c in contexts)
    if "runAsNonRoot" not in context and not as_root:
        context["runAsNonRoot"] = True
    context.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            own = container.setdefault("securityContext", {})
            capabilities = own.setdefault("capabilities", {})
            escalates = own.get("privileged") or "SYS_ADMIN" in (capabilities.get("add") or [])
            if "allowPrivilegeEscalation" not in own and not escalates:
                own["allowPrivilegeEscalation"] = False
            if "ALL" not in (capabilities.get("drop") or []):
                capabilities["drop"] = [*(capabilities.get("drop") or []), "ALL"]
    return spec
