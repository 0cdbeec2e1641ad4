"""What a trial pod looks like: pure functions from (template, trial, launch) to the
Pod, ConfigMap and Secret bodies the pod executor creates, and from an observed
Pod to what it means for the trial.  No I/O here.

Hyperparameters reach the container three ways, none of them through a shell:

- environment variables ``KUBETUNE_PARAM_<NAME>`` (name upper-cased, anything but
  letters, digits and ``_`` turned into ``_``);
- a JSON file, ``/etc/kubetune/config.json``, from a per-trial ConfigMap mounted
  read-only (the whole config: constants from ``spec.trial.config`` merged under
  the sampled parameters);
- ``${params.<name>}`` in the template's ``command`` and ``args``, replaced inside
  the one list element that names it: a value is always exactly one argument (or
  part of one), whatever it contains.

Kubernetes itself expands ``$(VAR)`` in ``command``, ``args`` and ``env`` values;
every ``$`` of a substituted value is doubled so the container sees it verbatim.
"""
from __future__ import annotations

import copy
import json
import math
import re
from typing import Any, Mapping

from kubetune.executors.base import LaunchRequest
from kubetune.executors.pods import kueue
from kubetune.executors.pods.times import epoch_of
from kubetune.spec.model import PARAM_REFERENCE, param_env_name
from kubetune.spec.pod_policy import KUEUE_PREFIX, restricted_defaults

LABEL_EXPERIMENT = "kubetune.dev/experiment"
LABEL_TRIAL = "kubetune.dev/trial"
LABEL_ATTEMPT = "kubetune.dev/attempt"
ANNOTATION_TRIAL_KEY = "kubetune.dev/trial-key"
# "stdout": the operator reads the pod's results from its log (executors/pods/logs.py)
ANNOTATION_METRICS_COLLECTOR = "kubetune.dev/metrics-collector"

CONFIG_VOLUME = "kubetune-config"
CONFIG_DIR = "/etc/kubetune"
CONFIG_FILE = "config.json"
TOKEN_KEY = "token"
GPU_RESOURCE = "nvidia.com/gpu"
MAX_LABEL_VALUE = 63



class PodSpecError(ValueError):
    """The pod template cannot be turned into a trial pod; the message names the fix."""


def pod_name(trial: str, attempt: int) -> str:
    """``<trial>-a<attempt>``: a Trial's name ends in ``-<index>``, so no pod name of one
    trial can be another trial's."""
    return f"{trial}-a{attempt}"


def config_map_name(trial: str) -> str:
    return f"{trial}-params"


def secret_name(trial: str) -> str:
    return f"{trial}-token"


def format_value(value: Any) -> str:
    """A parameter as text: strings as they are, everything else as JSON (``true``, ``0.01``)."""
    return value if isinstance(value, str) else json.dumps(value)


def escape_expansion(text: str) -> str:
    """Protect ``text`` from Kubernetes' ``$(VAR)`` expansion (``$$`` reads as ``$``)."""
    return text.replace("$", "$$")


def substitute(text: str, params: Mapping[str, Any], where: str) -> str:
    """Replace each ``${params.<name>}`` in one command/args element."""
    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            raise PodSpecError(f"{where}: ${{params.{name}}} names no parameter (known: {known})")
        return escape_expansion(format_value(params[name]))
    return PARAM_REFERENCE.sub(value, text)


def owner_reference(trial: str, trial_uid: str) -> dict[str, Any]:
    return {"apiVersion": "kubetune.dev/v1alpha1", "kind": "Trial", "name": trial, "uid": trial_uid,
            "controller": True, "blockOwnerDeletion": True}


def labels(experiment: str, trial: str) -> dict[str, str]:
    found = {LABEL_EXPERIMENT: experiment}
    if len(trial) <= MAX_LABEL_VALUE:    # a label value has 63 characters at most
        found[LABEL_TRIAL] = trial
    return found


def config_map_body(namespace: str, experiment: str, trial: str, trial_uid: str,
                    config: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(trial), "namespace": namespace,
                         "labels": labels(experiment, trial),
                         "ownerReferences": [owner_reference(trial, trial_uid)]},
            "data": {CONFIG_FILE: json.dumps(dict(config), sort_keys=True, indent=1)}}


def secret_body(namespace: str, experiment: str, trial: str, trial_uid: str, token: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": secret_name(trial), "namespace": namespace,
                         "labels": labels(experiment, trial),
                         "ownerReferences": [owner_reference(trial, trial_uid)]},
            "stringData": {TOKEN_KEY: token}}


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def container_resources(resources: Any) -> dict[str, dict[str, str]]:
    """``spec.trial.resources`` as a container's requests and limits (GPUs as nvidia.com/gpu,
    custom resources by their name, e.g. ``example.com/fpga``)."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if resources is None:
        return {}
    if resources.cpu:
        requests["cpu"] = _quantity(resources.cpu)
    if resources.memory_bytes:
        requests["memory"] = limits["memory"] = str(int(resources.memory_bytes))
    if resources.gpu:   # whole GPUs: spec/parse.py checks it for the pod executor
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = _quantity(resources.gpu)
    for name, amount in dict(resources.custom or {}).items():
        if amount:
            requests[name] = limits[name] = _quantity(math.ceil(amount))
    found = {}
    if requests:
        found["requests"] = requests
    if limits:
        found["limits"] = limits
    return found


def render_pod(template: Mapping[str, Any], *, namespace: str, experiment: str, trial: str,
               trial_uid: str, attempt: int, params: Mapping[str, Any], env: Mapping[str, str],
               resources: Any = None, metrics_collector: str = "push", queue: str | None = None,
               priority_class: str | None = None) -> dict[str, Any]:
    """The Pod of one attempt of one trial.

    ``env`` holds kubetune's own variables (ingest URL, attempt, ...); the token comes
    from the trial's Secret, never inline.  The first container gets
    ``spec.trial.resources`` unless the template sets its resources itself.  Whatever
    the template leaves unset gets the restricted profile's value (spec/pod_policy.py);
    what it may set at all is checked before (``PodExecutor.policy_violations``).
    """
    if not template or not (template.get("spec") or {}).get("containers"):
        raise PodSpecError("spec.trial.template.spec.containers: required for the pod executor: "
                           "the container that runs one trial")
    meta = template.get("metadata") or {}
    spec = copy.deepcopy(dict(template["spec"]))
    spec["restartPolicy"] = "Never"       # a retry is a new pod: kubetune counts attempts
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != CONFIG_VOLUME] + [
        {"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(trial)}}]
    ours = [{"name": name, "value": escape_expansion(value)} for name, value in env.items()]
    ours.append({"name": "KUBETUNE_TRIAL_TOKEN",
                 "valueFrom": {"secretKeyRef": {"name": secret_name(trial), "key": TOKEN_KEY}}})
    by_env: dict[str, str] = {}
    for name in params:
        other = by_env.setdefault(param_env_name(name), name)
        if other != name:   # spec/parse.py refuses these at apply; one value would be lost silently
            raise PodSpecError(f"parameters {other!r} and {name!r} are both passed as {param_env_name(name)}; "
                               "rename one of them")
    ours += [{"name": param_env_name(name), "value": escape_expansion(format_value(value))}
             for name, value in params.items()]
    names = {item["name"] for item in ours}
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(kind) or []):
            where = f"spec.trial.template.spec.{kind}[{index}]"
            for field in ("command", "args"):
                if container.get(field):
                    container[field] = [substitute(str(item), params, f"{where}.{field}")
                                        for item in container[field]]
            container["env"] = ours + [e for e in container.get("env") or [] if e.get("name") not in names]
            container["volumeMounts"] = [m for m in container.get("volumeMounts") or []
                                         if m.get("name") != CONFIG_VOLUME] + [
                {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
    spec = restricted_defaults(spec)
    main = spec["containers"][0]
    if not main.get("resources"):
        shaped = container_resources(resources)
        if shaped:
            main["resources"] = shaped
    # Kueue's labels are set from spec.queue/spec.priorityClass only (pod_policy refuses them
    # in a template; dropped here too, whoever calls)
    pod_labels = {**{k: v for k, v in (meta.get("labels") or {}).items() if not str(k).startswith(KUEUE_PREFIX)},
                  **labels(experiment, trial), LABEL_ATTEMPT: str(attempt)}
    # Kueue's Pod integration: its webhook gates a pod that names a LocalQueue until the
    # workload is admitted (kueue.py)
    if queue:
        pod_labels[kueue.QUEUE_LABEL] = queue
    if priority_class:
        pod_labels[kueue.PRIORITY_CLASS_LABEL] = priority_class
    annotations = {**{k: v for k, v in (meta.get("annotations") or {}).items() if not str(k).startswith(KUEUE_PREFIX)},
                   ANNOTATION_TRIAL_KEY: f"{namespace}/{experiment}/{trial}"}
    if metrics_collector != "push":   # recorded on the pod: an operator restarted later reads it the same way
        annotations[ANNOTATION_METRICS_COLLECTOR] = metrics_collector
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(trial, attempt), "namespace": namespace, "labels": pod_labels,
                     "annotations": annotations,
                     "ownerReferences": [owner_reference(trial, trial_uid)]},
        "spec": spec,
    }


# ---------------------------------------------------------------- reading a pod back

# Pod failures the trial did not cause: retried without counting against maxFailures.
_CLUSTER_REASONS = {"Evicted", "Preempting", "Preempted", "NodeLost", "NodeShutdown", "Shutdown",
                    "Terminated", "UnexpectedAdmissionError", "DeletionByTaintManager"}


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The kube-scheduler's message if it cannot place the pod (e.g. ``0/2 nodes are
    available: 2 Insufficient nvidia.com/gpu``), else None."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending" or (pod.get("spec") or {}).get("nodeName"):
        return None
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" \
                and condition.get("reason") == "Unschedulable":
            return condition.get("message") or "the kube-scheduler cannot place the pod"
    return None


# Containers the kubelet cannot start (README, troubleshooting). The image and the
# template are the same for every trial, so none of these fixes itself by waiting long:
# FATAL_WAITING fails the trial at once; the others may be passing (a registry hiccup, a
# Secret created a moment later) and show the trial as Queued with the kubelet's reason
# until CONTAINER_WAITING_TIMEOUT_S after the pod started, then fail it.
FATAL_WAITING = {"InvalidImageName", "ErrImageNeverPull"}
PASSING_WAITING = {"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError",
                   "CrashLoopBackOff", "RunContainerError", "PreCreateHookError", "PreStartHookError"}
CONTAINER_WAITING_TIMEOUT_S = 120.0


def container_waiting(pod: Mapping[str, Any], now: float) -> tuple[str, str, bool] | None:
    """``(reason, message, failed)`` when a container of the pod cannot start: the
    kubelet's reason and message, and whether the trial fails (a fatal reason, or one
    that lasted ``CONTAINER_WAITING_TIMEOUT_S`` since the pod started); else None.
    ``now``: epoch seconds."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Pending", "Running"):
        return None
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason not in FATAL_WAITING and reason not in PASSING_WAITING:
            continue
        message = f"container {container.get('name')}: {(waiting.get('message') or reason).strip()}"
        if reason in FATAL_WAITING:
            return reason, message, True
        started = epoch_of(status.get("startTime"))
        if started is not None and now - started >= CONTAINER_WAITING_TIMEOUT_S:
            return reason, f"{message} (for {now - started:.0f}s, the limit is {CONTAINER_WAITING_TIMEOUT_S:.0f}s)", True
        return reason, message, False
    return None


def run_times(pod: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """When the trial's container (the first) started and ended, on the kubelet's clock:
    what the usage ledger counts (core/usage.py); (None, None) before it started."""
    containers = (pod.get("status") or {}).get("containerStatuses") or []
    state = (containers[0].get("state") or {}) if containers else {}
    if state.get("running"):
        return epoch_of(state["running"].get("startedAt")), None
    if state.get("terminated"):
        ended = state["terminated"]
        return epoch_of(ended.get("startedAt")), epoch_of(ended.get("finishedAt"))
    return None, None


def failure(pod: Mapping[str, Any]) -> tuple[str, bool]:
    """Why a Failed pod failed, and whether the cluster (not the trial) caused it."""
    status = pod.get("status") or {}
    parts = []
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated") or {}
        if ended and ended.get("exitCode", 0) != 0:
            text = f"container {container.get('name')} exited with code {ended.get('exitCode')}"
            if ended.get("reason"):
                text += f" ({ended['reason']})"
            if ended.get("message"):
                text += f": {ended['message'].strip()}"
            parts.append(text)
    reason = status.get("reason") or ""
    disrupted = any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
    if reason or status.get("message"):
        parts.insert(0, f"pod {reason or 'failed'}: {status.get('message') or ''}".rstrip(": "))
    return "; ".join(parts) or "pod failed", reason in _CLUSTER_REASONS or disrupted


def trial_env(req: LaunchRequest, config_file: str, collector: str) -> dict[str, str]:
    """What a trial's process reads (trainable/pod_session.py): who it is, where its
    config is, how its results leave (``push`` to the ingest URL the caller adds, or
    ``stdout``), and the checkpoint it resumes from and where it saves; in a pod, and
    in a process of the operator's host (executors/local)."""
    env = {"KUBETUNE_TRIAL": req.trial_key, "KUBETUNE_ATTEMPT": str(req.attempt),
           "KUBETUNE_FIRST_SEQ": str(req.start_seq + 1),
           "KUBETUNE_START_ITERATION": str(req.start_iteration),
           "KUBETUNE_CONFIG_FILE": config_file}
    if collector != "push":    # kubetune.report() prints its results
        env["KUBETUNE_METRICS_COLLECTOR"] = collector
    if req.checkpoint:
        env["KUBETUNE_CHECKPOINT"] = req.checkpoint
    if req.storage:
        env["KUBETUNE_CHECKPOINT_STORAGE"] = req.storage
        env["KUBETUNE_CHECKPOINT_OPTIONS"] = json.dumps(
            {"keep_last": req.keep_last, "keep_best": req.keep_best, "metric": req.metric, "mode": req.mode})
    return env
