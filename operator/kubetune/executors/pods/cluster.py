"""The pod platform (``spec.executor: pod``): what the controller holds for pod trials.

``PodPlatform`` is the ``Platform`` (executors/platform.py) of pod trials.  Unlike a
Ray cluster's: the kube-scheduler, not kubetune, decides where and when a pod
runs, so the ledger grants every trial at once (the runner launches up to
``parallelism`` and a pod the scheduler cannot place shows as Queued, see
``controller/platform_queue.py``); there is no connection to lose, only the API server;
and Kueue (kueue.py) says what a queued pod waits for.  ``PodPlatforms`` is
its ``PlatformProvider``: one PodPlatform for the whole operator.

``PodSupport`` wires the operator-wide parts: one ``ResultInbox``, the HTTP ingest
server trial pods report to, and the ``PodExecutor``.  Off (the operator's default,
without ``--pod-executor``) nothing listens and pod Experiments are refused with a
message naming the switch: an operator that runs no pods offers no endpoint to abuse.
"""
from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Mapping

from kubetune.executors.pods import kueue
from kubetune.core.resources import ResourceLedger, Resources
from kubetune.executors.base import LaunchRequest
from kubetune.executors.platform import ExecutorPlatform
from kubetune.executors.pods.ingest import IngestServer, ResultInbox
from kubetune.executors.pods.executor import PodExecutor
from kubetune.spec.model import ExperimentSpec

log = logging.getLogger(__name__)

DEFAULT_INGEST_PORT = 8081
INGEST_SERVICE = "kubetune-ingest"     # the chart's Service in front of the operator's ingest port


class UnboundedLedger(ResourceLedger):
    """Grants everything: pods wait in the kube-scheduler's queue, not in kubetune's."""

    def feasibility(self, bundles: list[Resources]) -> str | None:
        return None

    def try_acquire(self, owner: str, bundles: list[Resources], priority: int = 0) -> bool:
        self.adopt(owner, bundles)
        return True


class PodPlatform(ExecutorPlatform):
    """The ``Platform`` of pod trials: one for the whole operator."""

    address = "pod"
    lost_run_message = "the trial's pod is gone"

    def __init__(self, executor: PodExecutor, problem: str = "") -> None:
        self.executor = executor
        self.ledger = UnboundedLedger()
        self.last_error = ""
        self._problem = problem          # set when the ingest endpoint could not start
        self._connected = False

    @property
    def connected(self) -> bool:
        return self._connected and not self.last_error

    async def ensure_connected(self) -> bool:
        if self._problem:
            self.last_error = self._problem
            return False
        if not self._connected:
            await asyncio.to_thread(self.executor.connect)
            self._connected = True
        self.last_error = ""
        return True

    def mark_unavailable(self, error: BaseException | str) -> None:
        self.last_error = f"Kubernetes API call failed: {error}"

    async def refresh_capacity(self) -> None:
        """Nothing to track: the kube-scheduler places pods."""

    def launch_waiting(self, request: LaunchRequest) -> tuple[str, str] | None:
        # Kueue's webhook gates the pod as it is created: Queued from the start (a Trial
        # written now, or before the first poll, must not say Running)
        if request.queue:
            return kueue.QUEUED, f"waiting for Kueue admission in queue {request.queue}"
        return None

    def shown_waiting(self, reason: str, message: str, evictions: int, since_eviction: bool) -> tuple[str, str]:
        return kueue.shown_waiting(reason, message, evictions, since_eviction)

    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]:
        return await asyncio.to_thread(self.executor.policy_violations, namespace, spec.trial.template,
                                       spec.priority_class)

    async def end_runs(self, prefix: str) -> bool:
        """Nothing to end: a finished Experiment's runner stopped each of its pods."""
        return True

    async def end_all(self, prefix: str) -> int:
        """Nothing to end: its pods go with their Trials (garbage collection)."""
        return 0

    async def release(self, trial_keys: list[str]) -> None:
        for key in trial_keys:
            self.ledger.release(key)


class PodPlatforms:
    """The ``PlatformProvider`` of ``spec.executor: pod``: the one ``PodPlatform``."""

    def __init__(self, platform: PodPlatform) -> None:
        self.platform = platform

    def platform_for(self, spec: ExperimentSpec, namespace: str) -> PodPlatform:
        return self.platform

    def cleanup_platform(self, spec: Mapping[str, Any], namespace: str) -> None:
        """None: the garbage collector removes a deleted Experiment's pods with its Trials."""
        return None

    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]:
        return await self.platform.policy_violations(namespace, spec)

    def platforms(self) -> list[PodPlatform]:
        return [self.platform]

    async def retire_idle(self, in_use: set[str]) -> list[str]:
        return []      # no driver process: the API client stays


def default_ingest_url(port: int) -> str:
    """Where trial pods reach the ingest endpoint: the chart's Service when the operator
    runs in a cluster (``POD_NAMESPACE`` from the downward API), else loopback."""
    namespace = os.environ.get("POD_NAMESPACE")
    if namespace and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return f"http://{INGEST_SERVICE}.{namespace}.svc:{port}"
    return f"http://127.0.0.1:{port}"


class PodSupport:
    """The ingest server plus the pod executor, started with the operator."""

    def __init__(self, *, port: int = DEFAULT_INGEST_PORT, url: str = "", host: str = "0.0.0.0",
                 allow: frozenset[str] = frozenset(), namespace_opt_in: bool = False,
                 priority_classes: frozenset[str] = frozenset()) -> None:
        self.inbox = ResultInbox()
        self.server = IngestServer(self.inbox, host=host, port=port)
        self._url = url
        self._policy = {"allow": allow, "namespace_opt_in": namespace_opt_in, "priority_classes": priority_classes}
        self.handle: PodPlatform | None = None

    async def start(self) -> PodPlatforms:
        """Listen for results; a port already taken is reported on pod Experiments, not fatal."""
        problem = ""
        try:
            await self.server.start()
        except OSError as error:
            problem = f"the result ingest endpoint cannot listen on port {self.server.port}: {error}"
            log.error("%s; Experiments with executor: pod will not run", problem)
        executor = PodExecutor(self.inbox, self._url or default_ingest_url(self.server.port), **self._policy)
        self.handle = PodPlatform(executor, problem)
        return PodPlatforms(self.handle)

    async def stop(self) -> None:
        await self.server.stop()


POD_EXECUTOR_OFF = ("executor: pod is disabled in this operator: start it with --pod-executor "
                    "(the chart: podExecutor.enabled=true)")
