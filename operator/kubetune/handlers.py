"""kopf registration only: every handler routes to controller.operator_state.

``register(settings)`` registers the handlers with the settings ``kubetune operator``
built (settings.OperatorSettings); importing this module registers nothing."""
from __future__ import annotations

import asyncio
import logging
import os
import threading

import kopf

from kubetune import metrics
from kubetune.controller.operator_state import CleanupPending, OperatorState
from kubetune.executors.platform import PlatformRegistry
from kubetune.executors.pods.cluster import POD_EXECUTOR_OFF, PodSupport
from kubetune.executors.ray import sandbox as ray_sandbox
from kubetune.executors.ray.platform import RayPlatforms
from kubetune.k8s import rate_limit
from kubetune.k8s.client import EXPERIMENTS, GROUP, VERSION, in_cluster, load_config
from kubetune.k8s.diffbase import DigestDiffBaseStorage
from kubetune.k8s.store import KubeStore
from kubetune.results import open_store
from kubetune.results.writer import ResultsWriter
from kubetune.settings import OperatorSettings

STATE: OperatorState | None = None
RESULTS: ResultsWriter | None = None  # every result to the results store, from its own thread
PODS: PodSupport | None = None       # executor: pod (the result ingest endpoint + pod executor)
_RETIRING: asyncio.Task | None = None  # ends the driver processes no Experiment needs
_CONNECTING: asyncio.Task | None = None  # the start-up connection to the operator's own Ray


_PREPARED: dict = {}   # address -> an executor a standby connected ahead of leading


def _new_executor(address: str, lease_timeout_s: float):
    from kubetune.executors.ray.executor import RayExecutor   # Ray is imported only when needed
    # a running trial no controller has called for this long ends itself (0: never)
    return RayExecutor(address, lease_timeout_s=lease_timeout_s)


def _executor_factory(chosen: OperatorSettings):
    def factory(address: str):
        return _PREPARED.pop(address, None) or _new_executor(address, chosen.trial_lease_seconds)
    return factory


def _driver_process(chosen: OperatorSettings):
    """The executor of an address other than the operator's own: a Ray driver process
    of its own (executors/ray/process.py), with none of the operator's credentials; the
    token of that cluster's own if its allow-list entry names one (``token_env``).  Also
    returns the node's Landlock ABI, which sandboxes those processes (0: none here)."""
    def factory(address: str, token_env: str = ""):
        from kubetune.executors.ray.process import DriverProcess
        return DriverProcess(address, {"lease_timeout_s": chosen.trial_lease_seconds},
                             token=os.environ.get(token_env, "") if token_env else "",
                             sandbox=sandbox_abi > 0)   # 0: allowed unsandboxed, else never made
    sandbox_abi = ray_sandbox.available()
    if not sandbox_abi:
        logging.getLogger(__name__).warning(
            "this kernel has no Landlock: driver processes for Ray clusters other than --ray-address %s",
            "run without a sandbox (--allow-unsandboxed-ray-drivers)" if chosen.allow_unsandboxed_ray_drivers
            else "are not started (--allow-unsandboxed-ray-drivers would start them without one)")
    return factory, sandbox_abi


def prepare_executor(chosen: OperatorSettings) -> None:
    """Connect to Ray now (blocking: call it in a thread), for the cluster handle to take
    when this replica leads: a driver connection only, no actor is touched until then."""
    executor = _new_executor(chosen.ray_address, chosen.trial_lease_seconds)
    executor.connect()
    _PREPARED[chosen.ray_address] = executor
    # the autoscaler's node types too (a task on the head: seconds on a loaded machine,
    # measured 2-24 s), so that the new leader's first capacity refresh waits for nothing;
    # in the background, not holding up the standby's bid for the Lease
    threading.Thread(target=_read_node_types_ahead, args=(executor,), daemon=True, name="node-types").start()


def _read_node_types_ahead(executor) -> None:
    try:
        executor.node_types()
    except Exception as error:  # noqa: BLE001 - the leader reads them (and reports) on its own
        logging.getLogger(__name__).warning("standby: cannot read the autoscaler's node types yet: %s", error)


async def connect_own_cluster(platforms: RayPlatforms) -> None:
    """Connect to the operator's own Ray cluster (``--ray-address``) at start-up, in the
    background: one attempt, as the first Experiment would make.  Without it the first
    Experiments applied to a running operator waited for ``ray.init`` and the first
    capacity read (measured 4-18 s on a loaded machine, issue 26) before any could create
    a Trial.  The connection is the one every Experiment on that address shares, so a
    burst meanwhile waits for it once; a cluster that does not answer is retried by the
    Experiments that need it, with the platform's backoff, and gets them no Trial until
    it answers (as before)."""
    handle = platforms.get(platforms.default_address)
    if await handle.ensure_connected():
        logging.getLogger(__name__).info("connected to Ray at %s", handle.address)


CLEANUP_RETRY_SECONDS = 3.0
CLEANUP_BACKSTOP_SECONDS = 60.0


def register(chosen: OperatorSettings, registry: kopf.OperatorRegistry | None = None) -> None:
    """Register the operator's handlers (in kopf's default registry unless given one),
    every one of them using ``chosen``."""
    registry = registry or kopf.get_default_registry()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_) -> None:
        global STATE, PODS, RESULTS, _RETIRING, _CONNECTING
        load_config()
        rate_limit.configure(chosen.kube_api_qps, chosen.kube_api_burst)
        settings.persistence.finalizer = "kubetune.dev/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kubetune.dev")
        # a digest, not a copy of the spec: an annotation is limited to 256 KiB (k8s/diffbase.py)
        settings.persistence.diffbase_storage = DigestDiffBaseStorage(
            prefix="kubetune.dev", key="last-handled-configuration")
        settings.posting.level = logging.WARNING   # our own Events only; kopf's info logs stay in the log
        settings.watching.server_timeout = 300
        # kopf would watch every CRD (and, namespaced, every Namespace) to notice resources
        # appearing later; kubetune serves two fixed CRDs installed before it starts, so it
        # runs without those cluster-wide reads (least privilege: charts/kubetune RBAC)
        settings.scanning.disabled = True
        drivers, sandbox_abi = _driver_process(chosen)
        providers = {"ray": RayPlatforms(chosen.ray_address, _executor_factory(chosen),
                                         separate_factory=drivers, sandbox_abi=sandbox_abi,
                                         allow_unsandboxed=chosen.allow_unsandboxed_ray_drivers,
                                         allow_local=chosen.allow_local_ray or not in_cluster(),
                                         idle_s=chosen.ray_driver_idle_seconds,
                                         weights=dict(chosen.namespace_weights),
                                         allowed=chosen.ray_allowed_addresses, max_drivers=chosen.max_ray_drivers)}
        if chosen.pod_executor:   # off: nothing listens on the ingest port
            PODS = PodSupport(port=chosen.ingest_port, url=chosen.ingest_url, allow=chosen.pod_allow,
                              namespace_opt_in=chosen.pod_namespace_opt_in,
                              priority_classes=chosen.pod_priority_classes)
            providers["pod"] = await PODS.start()
        clusters = PlatformRegistry(providers, refusals={"pod": POD_EXECUTOR_OFF})
        # opened by the writer's thread: a database that is down at start delays the
        # results (kept, retried), never the operator
        RESULTS = ResultsWriter(lambda: open_store(chosen.results_url or None),
                                retention_s=chosen.results_retention_days * 86400.0)
        STATE = OperatorState(
            clusters,
            store_factory=lambda namespace, name, body: KubeStore(namespace, name,
                                                                 uid=body.get("metadata", {}).get("uid")),
            checkpoint_storage=chosen.checkpoint_storage, results=RESULTS, dashboard_url=chosen.dashboard_url)
        metrics.watch_state(lambda: STATE)
        if chosen.ray_address != "local":    # "local" would start a Ray of its own with no Experiment
            _CONNECTING = asyncio.create_task(connect_own_cluster(providers["ray"]), name="connect-own-ray")
        # checked a few times per grace period: a driver ends at most ~1/4 of it late
        _RETIRING = asyncio.create_task(STATE.retire_idle_drivers_forever(
            min(30.0, max(0.5, chosen.ray_driver_idle_seconds / 4))), name="retire-idle-ray-drivers")

    @kopf.daemon(GROUP, VERSION, EXPERIMENTS, cancellation_timeout=30.0, registry=registry)
    async def run_experiment(namespace: str, name: str, body: kopf.Body, stopped: kopf.DaemonStopped, **_) -> None:
        try:
            await STATE.serve(namespace, name, body, stopped.is_set)
        except Exception as error:   # kopf logs it and restarts the daemon; count it
            metrics.reconcile_error(type(error).__name__)
            raise

    @kopf.on.update(GROUP, VERSION, EXPERIMENTS, field="spec", registry=registry)
    async def spec_changed(namespace: str, name: str, **_) -> None:
        STATE.wake(namespace, name)

    # An Experiment's finalizer stays until its trials are ended, retried every few seconds;
    # after settings.cleanup_timeout_seconds the operator gives up and lets it go (the trials'
    # own lease then ends them: trainable/host.py), releasing what it held for it.  That is
    # decided here, not by kopf's handler timeout, which would drop the finalizer without
    # calling us (ledger holdings and the controller would stay). Each failed attempt is a
    # Warning Event.
    # (kopf's timeout stays, far past ours, as a backstop only: every attempt is retried
    # within CLEANUP_RETRY_SECONDS, so ours is always seen first)
    @kopf.on.delete(GROUP, VERSION, EXPERIMENTS, registry=registry,
                    timeout=chosen.cleanup_timeout_seconds + CLEANUP_BACKSTOP_SECONDS)
    async def experiment_deleted(namespace: str, name: str, body: kopf.Body, retry: int, runtime, **_) -> None:
        give_up = runtime.total_seconds() >= chosen.cleanup_timeout_seconds
        try:
            await STATE.delete(namespace, name, body, give_up=give_up)
        except Exception as error:  # noqa: BLE001 - CleanupPending, or the API server failing us
            if give_up:
                kopf.event(body, type="Warning", reason="CleanupAbandoned",
                           message=f"gave up after {runtime.total_seconds():.0f}s: {error}"[:1000])
                return
            if isinstance(error, CleanupPending):
                kopf.event(body, type="Warning", reason="CleanupPending",
                           message=f"attempt {retry + 1}: {error}"[:1000])
            raise kopf.TemporaryError(str(error), delay=CLEANUP_RETRY_SECONDS) from error

    @kopf.on.cleanup(registry=registry)
    async def stop_ingest_and_results(**_) -> None:
        for task in (_RETIRING, _CONNECTING):
            if task is not None:
                task.cancel()
        if PODS is not None:
            await PODS.stop()
        if RESULTS is not None:   # what the last cycles handed over
            await asyncio.to_thread(RESULTS.close)
