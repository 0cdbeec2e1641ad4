"""The pod executor's side of the controller (``spec.executor: pod``).

``PodClusterHandle`` stands where a Ray ``ClusterHandle`` stands for Ray trials, with
two differences: the kube-scheduler, not kubetune, decides where and when a pod
runs, so the ledger grants every trial at once (the runner launches up to
``parallelism`` and a pod the scheduler cannot place shows as Queued, see
``platform_queue``); and there is no connection to lose, only the API server.

``PodSupport`` wires the operator-wide parts: one ``ResultInbox``, the HTTP ingest
server trial pods report to, and the ``PodExecutor``.  Off (the operator's default,
without ``--pod-executor``) nothing listens and pod Experiments are refused with a
message naming the switch: an operator that runs no pods offers no endpoint to abuse.
"""
from __future__ import annotations

import asyncio
import logging
import os

from kubetune.core.resources import ResourceLedger, Resources
from kubetune.executors.pods.ingest import IngestServer, ResultInbox
from kubetune.executors.pods.executor import PodExecutor

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


class PodClusterHandle:
    """What ``ExperimentController`` uses of a cluster handle, for pod trials."""

    address = "pod"

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

    async def policy_violations(self, namespace: str, template, priority_class: str | None = None) -> list[str]:
        return await asyncio.to_thread(self.executor.policy_violations, namespace, template, priority_class)


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
        self.handle: PodClusterHandle | None = None

    async def start(self) -> PodClusterHandle:
        """Listen for results; a port already taken is reported on pod Experiments, not fatal."""
        problem = ""
        try:
            await self.server.start()
        except OSError as error:
            problem = f"the result ingest endpoint cannot listen on port {self.server.port}: {error}"
            log.error("%s; Experiments with executor: pod will not run", problem)
        executor = PodExecutor(self.inbox, self._url or default_ingest_url(self.server.port), **self._policy)
        self.handle = PodClusterHandle(executor, problem)
        return self.handle

    async def stop(self) -> None:
        await self.server.stop()


POD_EXECUTOR_OFF = ("executor: pod is disabled in this operator: start it with --pod-executor "
                    "(the chart: podExecutor.enabled=true)")
