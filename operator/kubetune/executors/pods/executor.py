"""Run each trial as one Pod (``spec.executor: pod``): any container, any language.

Per trial, owned by its Trial resource (so deleting the Experiment deletes them all):

- a Secret ``<trial>-token`` with a random token: the pod reads it (env
  ``KUBETUNE_TRIAL_TOKEN``) and sends it with every result; the ingest endpoint
  accepts a trial's results only with that trial's token;
- a ConfigMap ``<trial>-params`` with the trial's config as JSON, mounted read-only
  at ``/etc/kubetune/config.json``;
- one Pod per attempt, ``<trial>-a<attempt>`` (spec.py renders it): a failed
  pod is replaced by a new one, with the latest checkpoint passed in
  (``KUBETUNE_CHECKPOINT``); the failed pods stay until the Trial goes, for their logs.

Results are pushed by the pod to the operator (ingest.py) and buffered in a
``ResultInbox``; with ``spec.trial.metricsCollector: stdout`` the operator reads them
from the pod's log instead (logs.py) into the same inbox.  ``poll`` hands them
over with the state read from the pod:

- Pending and the kube-scheduler cannot place it: running for the runner (it holds
  a parallelism slot), with ``waiting_reason``/``waiting_message`` set, which the
  controller shows as Queued with the scheduler's message (and the cluster
  autoscaler's latest event on the pod: TriggeredScaleUp, NotTriggerScaleUp);
- a container the kubelet cannot start (ImagePullBackOff, CreateContainerConfigError,
  ...): Queued with the kubelet's reason, then failed after
  ``pod_spec.CONTAINER_WAITING_TIMEOUT_S`` (InvalidImageName, ErrImageNeverPull: at once);
- Running, Pending (image pull, ...): running;
- Succeeded: completed, once every result it pushed was delivered;
- Failed: failed with the exit code, reason (OOMKilled, Error) and the log tail;
  evicted, preempted or lost with its node: missing, a cluster fault (retried
  without counting against ``maxFailures``); gone altogether: missing.

With Kueue (``spec.queue``; kueue.py) a trial's pod carries the LocalQueue and
WorkloadPriorityClass labels of Kueue's Pod integration, and its state says:

- gated by Kueue: running for the runner, ``awaiting_admission`` with the reason
  (WaitingForAdmission, or Provisioning while an admission check is pending);
- admitted: running, with the time it waited (``queue_wait_s``);
- evicted (Kueue marks the pod ``TerminationTarget`` and deletes it, and records why in
  an event that outlives it): missing with ``evicted`` (Preempted, Evicted), which the
  runner takes as a pause: the next attempt starts from the latest checkpoint and waits
  for admission again.

Why Kueue's Pod integration and not one batch Job per trial: on preemption Kueue
suspends a Job and later recreates its pod from the Job's unchanged template, i.e. from
the checkpoint the trial started with, with the attempt and result numbers of the first
run; kubetune makes every attempt a new pod with the latest checkpoint and the next
sequence number, so a deleted pod is exactly the pause it needs.

Pods are read with one list call per experiment, at most every ``list_interval_s``
(listing.py); a trial's Secret and ConfigMap are trial_objects.py's, the cluster's
capacity capacity.py's.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping

from kubetune.executors.pods import capacity, kueue
from kubetune.executors.pods import spec as pod_spec
from kubetune.executors.base import ClusterResources, ExecutorError, LaunchInfo, LaunchRequest, TrialState, TrialUpdate
from kubetune.executors.pods.ingest import ResultInbox
from kubetune.executors.pods.listing import PodListings, attempt_of, trial_of
from kubetune.executors.pods.logs import PodLogFollower, collects_stdout
from kubetune.executors.pods.trial_objects import TrialObjects
from kubetune.k8s.errors import ApiError
from kubetune.k8s.kueue import KueueApi
from kubetune.k8s.pods import PodApi
from kubetune.spec import pod_policy
from kubetune.spec.trial_key import ExperimentKey, TrialKey

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 20


class PodExecutor:
    """The Kubernetes-pod implementation of ``executors.base.TrialExecutor``.  Thread-safe."""

    def __init__(self, inbox: ResultInbox, ingest_url: str, *, api_client: Any = None,
                 list_interval_s: float = 1.0, allow: frozenset[str] = frozenset(),
                 namespace_opt_in: bool = False, priority_classes: frozenset[str] = frozenset()) -> None:
        self.address = "pod"
        self.inbox = inbox
        self.ingest_url = ingest_url.rstrip("/")
        self.api = PodApi(api_client)
        self.listings = PodListings(self.api, KueueApi(api_client), list_interval_s)
        self.objects = TrialObjects(self.api)
        self._lock = threading.RLock()
        self._attempts: dict[str, int] = {}          # trial key -> attempt this process started
        self._started_at: dict[str, float] = {}      # trial key -> monotonic time of its create
        self._queues: dict[str, str | None] = {}     # trial key -> the Kueue LocalQueue it was started in
        self.allow = frozenset(allow)                # pod_policy allowances the operator grants
        self.namespace_opt_in = namespace_opt_in     # and namespaces may grant themselves by label
        self.priority_classes = frozenset(priority_classes)   # the WorkloadPriorityClasses Experiments may name
        self.log_follower = PodLogFollower(inbox, self.api)

    # ---------------------------------------------------------------- connection

    def connect(self) -> None:
        with self._lock:
            self.api.core      # the client, made once

    @staticmethod
    def is_unavailable(error: BaseException) -> bool:
        # an API call that could not reach the API server; an answer (403, 422) is the trial's error
        return isinstance(error, ConnectionError)

    def disconnect(self) -> None:
        """Nothing to drop: pods run on without the operator."""

    # ---------------------------------------------------------------- start

    def start(self, req: LaunchRequest) -> LaunchInfo:
        """Create the attempt's pod (and the trial's Secret and ConfigMap); attach if it exists."""
        namespace, experiment, trial = TrialKey.parse(req.trial_key)
        template = req.pod_template
        if not template:
            raise ExecutorError("spec.trial.template: required for the pod executor (a PodTemplateSpec)")
        refused = self.policy_violations(namespace, template, req.priority_class)
        if refused:     # the controller refused the spec already; this holds whatever calls start
            raise ExecutorError("; ".join(refused))
        self.connect()
        uid = self.api.trial_uid(namespace, trial)
        token = self.objects.ensure_secret(namespace, experiment, trial, uid)
        self.objects.ensure_config_map(namespace, experiment, trial, uid, req.config)
        env = {**pod_spec.trial_env(req, f"{pod_spec.CONFIG_DIR}/{pod_spec.CONFIG_FILE}", req.metrics_collector),
               "KUBETUNE_INGEST_URL": self.ingest_url}
        pod = pod_spec.render_pod(template, namespace=namespace, experiment=experiment, trial=trial,
                                  trial_uid=uid, attempt=req.attempt, params=req.config, env=env,
                                  resources=req.resources, metrics_collector=req.metrics_collector,
                                  queue=req.queue, priority_class=req.priority_class)
        self._end_other_attempts(namespace, experiment, trial, req.attempt)
        with self._lock:
            self.inbox.open(req.trial_key, token, req.attempt, req.start_seq)
            self._attempts[req.trial_key] = req.attempt
            self._started_at[req.trial_key] = time.monotonic()
            self._queues[req.trial_key] = req.queue
        name = pod["metadata"]["name"]
        try:
            created = self.api.create_pod(namespace, pod)
        except ApiError as error:
            raise ExecutorError(f"cannot create pod {name}: {error.message}") from error
        return LaunchInfo(req.trial_key, name, attached=not created)   # not created: this attempt's pod exists

    def policy_violations(self, namespace: str, template: Mapping[str, Any] | None,
                          priority_class: str | None = None) -> list[str]:
        """What ``template`` (and ``priority_class``) ask for beyond the operator's and the
        namespace's allowances."""
        allowed = set(self.allow)
        if self.namespace_opt_in and pod_policy.violations(template, allowed):
            allowed |= pod_policy.namespace_allowances(self._labels_of(namespace))
        return pod_policy.violations(template, allowed) + \
            pod_policy.priority_class_violations(priority_class, self.priority_classes)

    def _labels_of(self, namespace: str) -> dict[str, str]:
        """Read only for a template that asks for more than the operator allows, when it
        launches: one GET beside the launch's own, and a label change counts at once."""
        try:
            return self.api.namespace_labels(namespace)
        except Exception as error:  # noqa: BLE001 - unreadable: no opt-in, the restricted profile holds
            log.warning("reading the labels of namespace %s failed: %s", namespace, error)
            return {}

    def _adopt(self, namespace: str, experiment: str, trial: str) -> None:
        """A running trial this process did not start (the operator restarted): learn its
        token from its Secret, once, here in the executor's thread.  The ingest endpoint
        itself never calls the API, so a POST for an unknown trial costs nothing."""
        try:
            token = self.objects.token(namespace, trial)
        except Exception as error:  # noqa: BLE001 - its pod's posts get 503 and retry; so do we
            log.warning("learning the token of trial %s/%s failed: %s", namespace, trial, error)
            return
        self.inbox.adopt(namespace, trial, experiment, token)

    def _end_other_attempts(self, namespace: str, experiment: str, trial: str, attempt: int) -> None:
        """A new attempt starts: an older one still running (after a restart) is ended."""
        for pod in self.listings.pods(namespace, experiment, force=True).values():
            if trial_of(pod) == trial and attempt_of(pod) != attempt \
                    and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                self._delete_pod(namespace, pod["metadata"]["name"])

    # ---------------------------------------------------------------- poll

    def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0,
             limit: int = 1000) -> dict[str, TrialUpdate]:
        """New results and state of each trial in ``cursors`` (trial key -> last seq seen)."""
        updates = {}
        for key, after_seq in cursors.items():
            namespace, experiment, trial = TrialKey.parse(key)
            pods = self.listings.pods(namespace, experiment)
            listing = self.listings.listing(namespace, experiment)
            attempt = self._current_attempt(key, trial, pods)
            pod = pods.get(pod_spec.pod_name(trial, attempt)) if attempt is not None else None
            drained = True
            if pod is not None and collects_stdout(pod):
                # an ended pod: its last lines are in the inbox after this, or (more than the
                # inbox holds) it is not drained yet and the trial has not ended for the controller
                drained = self.log_follower.track(key, pod, after_seq)
            elif pod is not None and self.inbox.token(namespace, trial) is None:
                self._adopt(namespace, experiment, trial)
            results = self.inbox.take(key, after_seq, limit)
            updates[key] = self._update(key, pod, attempt, results, listing.at, drained=drained)
        return updates

    def _current_attempt(self, key: str, trial: str, pods: Mapping[str, dict]) -> int | None:
        with self._lock:
            known = self._attempts.get(key)
        if known is not None:
            return known
        attempts = [attempt_of(p) for p in pods.values() if trial_of(p) == trial]
        return max(attempts) if attempts else None

    def _update(self, key: str, pod: dict | None, attempt: int | None, results: tuple,
                listed_at: float, *, drained: bool = True) -> TrialUpdate:
        checkpoint, iteration = self.inbox.latest(key)
        common = {"results": results, "attempt": attempt, "checkpoint": checkpoint, "iteration": iteration}
        if pod is None:
            with self._lock:
                started = self._started_at.get(key)
                queue = self._queues.get(key)
            if started is not None and started >= listed_at:   # created after the last listing
                if queue:        # Kueue's webhook gated it as it was created
                    return TrialUpdate(key, TrialState.RUNNING, waiting_reason=kueue.QUEUED, awaiting_admission=True,
                                       waiting_message=f"waiting for Kueue admission in queue {queue}", **common)
                return TrialUpdate(key, TrialState.RUNNING, **common)
            name = pod_spec.pod_name(TrialKey.parse(key).trial, attempt or 0)
            stopped = self.listings.kueue_stop_message(key, name)
            if stopped is not None:     # Kueue evicted it and its pod is gone already
                evicted = kueue.eviction(stopped)
                return TrialUpdate(key, TrialState.MISSING, cluster_fault=True, evicted=evicted.evicted,
                                   error=f"{evicted.evicted} by Kueue: {evicted.message}", **common)
            return TrialUpdate(key, TrialState.MISSING, cluster_fault=True,
                               error=f"the trial's pod {name} "
                                     "is gone (deleted, or its node was removed)", **common)
        phase = (pod.get("status") or {}).get("phase")
        common["run_started"], common["run_ended"] = pod_spec.run_times(pod)
        if kueue.managed(pod):
            namespace, experiment, _ = TrialKey.parse(key)
            with self._lock:
                listing = self.listings.listing(namespace, experiment)
                workload = listing.workloads.get(pod["metadata"].get("uid"))
                local_queue = listing.local_queues.get((pod["metadata"].get("labels") or {}).get(kueue.QUEUE_LABEL))
            kueue_state = kueue.admission(pod, workload, local_queue)
            # also for an ended or evicted pod: a trial admitted and stopped between two
            # polls was admitted all the same
            common["queue_wait_s"] = kueue_state.queue_wait_s
            if phase not in ("Succeeded", "Failed"):
                if kueue_state.evicted:
                    return TrialUpdate(key, TrialState.MISSING, cluster_fault=True, evicted=kueue_state.evicted,
                                       error=f"{kueue_state.evicted} by Kueue: {kueue_state.message}", **common)
                if kueue_state.waiting:
                    return TrialUpdate(key, TrialState.RUNNING, waiting_reason=kueue_state.waiting,
                                       waiting_message=kueue_state.message, awaiting_admission=True,
                                       queue_full=kueue_state.queue_full, **common)
        if phase in ("Succeeded", "Failed") and not drained:   # its last results are still in its log
            return TrialUpdate(key, TrialState.RUNNING, **common)
        if phase == "Succeeded":
            return TrialUpdate(key, TrialState.COMPLETED, **common)
        if phase == "Failed":
            error, cluster_fault = pod_spec.failure(pod)
            tail = self.logs(key, LOG_TAIL_LINES)
            if tail:
                error += f"\n--- last {LOG_TAIL_LINES} log lines ---\n{tail}"
            state = TrialState.MISSING if cluster_fault else TrialState.FAILED
            return TrialUpdate(key, state, error=error, cluster_fault=cluster_fault, **common)
        waiting = pod_spec.container_waiting(pod, time.time())
        if waiting is not None:   # the kubelet cannot start a container: Queued, then Failed
            reason, message, failed = waiting
            if failed:
                return TrialUpdate(key, TrialState.FAILED, error=f"{reason}: {message}", **common)
            return TrialUpdate(key, TrialState.RUNNING, waiting_reason=reason,
                               waiting_message=f"{reason}: {message}", **common)
        message = pod_spec.unschedulable(pod)
        if message is not None:
            namespace, experiment, _ = TrialKey.parse(key)
            with self._lock:
                scaling = self.listings.listing(namespace, experiment).autoscaler.get(pod["metadata"]["name"])
            return TrialUpdate(key, TrialState.RUNNING, waiting_reason="Unschedulable",
                               waiting_message=f"{message}; {scaling}" if scaling else message, **common)
        return TrialUpdate(key, TrialState.RUNNING, **common)

    # ---------------------------------------------------------------- stop / pause

    def stop(self, trial_key: str, *, after_seq: int | None = None,
             timeout_s: float = 5.0) -> TrialUpdate | None:
        """Delete the trial's pod (with its termination grace period).  Never raises.

        Results arriving afterwards are refused, and the pod's ``report()`` raises
        ``TrialStopped``.  With ``after_seq`` the results after it are returned first."""
        try:
            results = self.inbox.take(trial_key, after_seq) if after_seq is not None else ()
            checkpoint, iteration = self.inbox.latest(trial_key)
            self.inbox.stop(trial_key)
            self.log_follower.forget(trial_key)
            namespace, _, trial = TrialKey.parse(trial_key)
            with self._lock:
                attempt = self._attempts.pop(trial_key, None)
                self._started_at.pop(trial_key, None)
                self._queues.pop(trial_key, None)
            if attempt is None:
                attempts = [attempt_of(p) for p in self.listings.pods(*TrialKey.parse(trial_key)[:2]).values()
                            if trial_of(p) == trial]
                attempt = max(attempts) if attempts else None
            if attempt is not None and not self._finished(trial_key, pod_spec.pod_name(trial, attempt)):
                self._delete_pod(namespace, pod_spec.pod_name(trial, attempt))
            return TrialUpdate(trial_key, TrialState.STOPPED, results=results, attempt=attempt,
                               checkpoint=checkpoint, iteration=iteration)
        except Exception:  # noqa: BLE001 - stop must never raise
            log.exception("stopping trial %s", trial_key)
            return None

    def pause(self, trial_key: str, *, after_seq: int | None = None,
              timeout_s: float = 30.0) -> TrialUpdate | None:
        """A pod cannot be paused in memory: it is deleted, and the trial resumes from the
        latest checkpoint it reported (``checkpoint`` in the returned update)."""
        return self.stop(trial_key, after_seq=after_seq, timeout_s=timeout_s)

    def _finished(self, trial_key: str, name: str) -> bool:
        """The pod ended by itself (as last listed): it is kept, with its logs, until the
        Trial goes; it holds nothing on its node any more."""
        namespace, experiment, _ = TrialKey.parse(trial_key)
        with self._lock:
            listing = self.listings.last(namespace, experiment)
            pod = listing.pods.get(name) if listing else None
        return pod is not None and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    def _delete_pod(self, namespace: str, name: str) -> None:
        self.api.delete_pod(namespace, name)

    # ---------------------------------------------------------------- listing, cleanup

    def list_trials(self, prefix: str = "") -> list[str]:
        """Trials with a pod that has not finished, whose key starts with ``prefix``."""
        namespace, _, rest = prefix.partition("/")
        experiment = rest.split("/")[0] if rest else ""
        selector = f"{pod_spec.LABEL_EXPERIMENT}={experiment}" if experiment else pod_spec.LABEL_EXPERIMENT
        keys = {(p["metadata"].get("annotations") or {}).get(pod_spec.ANNOTATION_TRIAL_KEY)
                for p in self.api.list_pods(namespace or None, label_selector=selector)
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        return sorted(k for k in keys if k and k.startswith(prefix))

    def stop_all(self, prefix: str) -> int:
        """Delete every pod of ``"<namespace>/<experiment>/"``; how many.  Never raises."""
        try:
            namespace, experiment = ExperimentKey.parse(prefix)
            pods = self.listings.pods(namespace, experiment, force=True)
            for name in pods:
                self._delete_pod(namespace, name)
            self.inbox.forget(prefix)
            self.log_follower.forget_prefix(prefix)
            with self._lock:
                for key in [k for k in self._attempts if k.startswith(prefix)]:
                    self._attempts.pop(key, None)
                    self._started_at.pop(key, None)
                    self._queues.pop(key, None)
                self.listings.forget(namespace, experiment)
            return len(pods)
        except Exception:  # noqa: BLE001
            log.exception("deleting the pods under %s", prefix)
            return 0

    # ---------------------------------------------------------------- resources, logs

    def cluster_resources(self) -> ClusterResources:
        """Allocatable CPU, memory and GPUs per schedulable node, minus what bound pods request."""
        return capacity.cluster_resources(
            self.api.list_nodes(), self.api.list_pods(None, field_selector="status.phase!=Succeeded,status.phase!=Failed"))

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        """Nothing to do: the cluster autoscaler sees the pending pods themselves."""

    def logs(self, trial_key: str, lines: int = 200) -> str:
        """The tail of the current attempt's container log; "" if the kubelet has none."""
        namespace, _, trial = TrialKey.parse(trial_key)
        with self._lock:
            attempt = self._attempts.get(trial_key)
        if attempt is None:
            attempt = self._current_attempt(trial_key, trial, self.listings.pods(namespace, TrialKey.parse(trial_key)[1]))
        if attempt is None:
            return ""
        try:
            return self.api.pod_log_tail(namespace, pod_spec.pod_name(trial, attempt), lines)
        except Exception:  # noqa: BLE001 - no kubelet, no logs (kwok), or the pod is gone
            return ""

    def describe(self, trial_key: str) -> dict | None:
        """The current attempt's pod: name, phase, node, attempt."""
        namespace, experiment, trial = TrialKey.parse(trial_key)
        pods = self.listings.pods(namespace, experiment, force=True)
        attempt = self._current_attempt(trial_key, trial, pods)
        pod = pods.get(pod_spec.pod_name(trial, attempt)) if attempt is not None else None
        if pod is None:
            return None
        return {"trial_key": trial_key, "pod": pod["metadata"]["name"], "attempt": attempt,
                "phase": (pod.get("status") or {}).get("phase"), "node": (pod.get("spec") or {}).get("nodeName")}
