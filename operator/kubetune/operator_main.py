"""``kubetune operator``: run the kopf operator against the current KUBECONFIG
(or the in-cluster service account)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from kubetune.core.leadership import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S
from kubetune.settings import OperatorSettings, SettingError, env_fallback, from_args
from kubetune.spec.pod_policy import ALLOWANCES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--ray-address", default=env_fallback("KUBETUNE_RAY_ADDRESS", "local"),
                        help="default Ray cluster: local (embedded), auto, or ray://host:10001")
    # environment fallbacks are kept as text here and checked by settings.from_args, so
    # a bad value is an error naming the setting, and only for `kubetune operator`
    parser.add_argument("--allow-local-ray", action="store_true",
                        default=env_fallback("KUBETUNE_ALLOW_LOCAL_RAY", ""),
                        help="inside a Kubernetes cluster, allow Ray address 'local' (trials then run in "
                             "the operator's pod, next to its ServiceAccount token); outside one it always is")
    parser.add_argument("--checkpoint-storage", default=env_fallback("KUBETUNE_CHECKPOINT_STORAGE", ""),
                        help="default checkpoint storage when an Experiment names none")
    parser.add_argument("--trial-lease-seconds",
                        default=env_fallback("KUBETUNE_TRIAL_LEASE_SECONDS", "900"),
                        help="a running Ray trial that no operator has called for this long stops and frees "
                             "its resources (its controller is gone); 0: never. Longer than any operator outage "
                             "you want trials to outlive")
    parser.add_argument("--ray-allowed-addresses", action="append", default=None,
                        help="the Ray clusters an Experiment's spec.ray.address may name besides --ray-address "
                             "(comma-separated, repeatable): namespace-services (the default: a Service in the "
                             "Experiment's own namespace, ray://<service>.<namespace>[.svc]:<port>), an exact "
                             "address, or any (single-tenant only); ADDRESS=ENV makes that cluster's driver "
                             "authenticate with the token in the operator's environment variable ENV. The "
                             "operator's own Ray token and results URL never go to another cluster. An empty "
                             "value allows no other cluster; a refused address fails the Experiment")
    parser.add_argument("--max-ray-drivers", default=8,
                        help="Ray driver processes (one per Ray cluster other than --ray-address) at once, "
                             "1-256; past it an Experiment waits, its condition RayUnavailable saying so")
    parser.add_argument("--allow-unsandboxed-ray-drivers", action="store_true",
                        default=env_fallback("KUBETUNE_ALLOW_UNSANDBOXED_RAY_DRIVERS", ""),
                        help="where the node's kernel offers no full sandbox (Landlock ABI < 6, Linux < 6.12), "
                             "still start driver processes for Ray clusters other than --ray-address, with what "
                             "it offers: below ABI 6 code a hostile cluster sends them can signal (kill) the "
                             "operator; without Landlock it can read what the operator's container holds (its "
                             "ServiceAccount token). Off: such an Experiment waits, its condition "
                             "RayUnavailable saying so")
    parser.add_argument("--ray-driver-idle-seconds",
                        default=env_fallback("KUBETUNE_RAY_DRIVER_IDLE_SECONDS", "300"),
                        help="the driver process of a Ray address other than --ray-address ends once no "
                             "Experiment has needed it for this long (finished or deleted), and starts again "
                             "when one does")
    parser.add_argument("--leader-election", action="store_true",
                        default=env_fallback("KUBETUNE_LEADER_ELECTION", ""),
                        help="run as one of several replicas: only the holder of a coordination.k8s.io Lease "
                             "drives Experiments; the others wait to take over")
    parser.add_argument("--lease-name", default="kubetune-operator", help="the Lease's name")
    parser.add_argument("--lease-duration-seconds", default=LEASE_DURATION_S,
                        help="how long a standby waits after the leader's last renewal before it takes over "
                             "(the leader stops when it could not renew for 5/8 of it)")
    parser.add_argument("--lease-namespace", default="",
                        help="the Lease's namespace (default: $POD_NAMESPACE, else the first --namespace, "
                             "else default)")
    parser.add_argument("--identity", default="",
                        help="this replica's name in the Lease (default: $POD_NAME, else host and process id)")
    parser.add_argument("--log-level", default=env_fallback("KUBETUNE_LOG_LEVEL", "INFO"))
    parser.add_argument("--liveness", default="", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    # ports are flags only: KUBETUNE_METRICS_PORT and KUBETUNE_INGEST_PORT are the
    # service-link variables of the chart's own Services (kubetune.settings)
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (0: off)")
    parser.add_argument("--pod-executor", action="store_true",
                        help="run Experiments with executor: pod, and listen on the ingest port for their "
                             "results (off: nothing listens, pod Experiments are refused)")
    parser.add_argument("--pod-allow", action="append", default=[],
                        help="let trial pods have this (repeatable or comma-separated): "
                             f"{', '.join(ALLOWANCES)}; default: the restricted Pod Security profile")
    parser.add_argument("--pod-priority-classes", action="append", default=[],
                        help="the Kueue WorkloadPriorityClasses an Experiment's spec.priorityClass may name "
                             "(repeatable or comma-separated); default: none (a class can preempt other "
                             "teams' workloads in its cohort)")
    parser.add_argument("--pod-namespace-opt-in", action="store_true",
                        help="a namespace labelled pod-security.kubetune.dev/allow-<allowance>=true "
                             "allows that to its trial pods (the operator reads the namespace's labels)")
    parser.add_argument("--ingest-port", type=int, default=8081,
                        help="port of the endpoint trial pods (executor: pod) post their results to")
    parser.add_argument("--ingest-url", default=env_fallback("KUBETUNE_INGEST_ADVERTISE_URL", ""),
                        help="URL trial pods reach that endpoint at (default: the kubetune-ingest Service "
                             "in the operator's namespace, or http://127.0.0.1:PORT outside a cluster)")
    # "": $KUBETUNE_RESULTS_URL (results.default_url, the one reader of that variable), so
    # a PostgreSQL URL (with its password) can come from a Secret
    parser.add_argument("--kube-api-qps", default="50",
                        help="client-side rate limit of the operator's requests to the API server (Trial and "
                             "Experiment writes, LISTs, Events), in requests per second, as client-go's QPS")
    parser.add_argument("--kube-api-burst", default="100",
                        help="requests the operator may send at once above --kube-api-qps, as client-go's Burst")
    parser.add_argument("--namespace-weight", action="append", default=[], metavar="NAMESPACE=WEIGHT",
                        help="fair sharing of a shared Ray cluster: trials waiting for room are served so that "
                             "each namespace's share of the cluster follows its weight (default 1 for every "
                             "namespace), then equally between the Experiments of a namespace; spec.priority "
                             "still comes first. Repeat or comma-separate, e.g. team-a=2,team-b=0.5")
    parser.add_argument("--dashboard-url", default="",
                        help="where users reach the chart's dashboard (e.g. https://tuning.example.com): each "
                             "Experiment's status.dashboard then names its page there")
    parser.add_argument("--results-url", default="",
                        help="results store: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB "
                             "(default: sqlite:///~/.local/share/kubetune/results.db)")
    parser.add_argument("--results-retention-days",
                        default=env_fallback("KUBETUNE_RESULTS_RETENTION_DAYS", "0"),
                        help="remove from the results store the Succeeded or Failed Experiments first seen this "
                             "many days ago (checked hourly); 0: keep them until the Experiment is deleted "
                             "(a deleted Experiment's results are always removed)")


def main(args: argparse.Namespace) -> int:
    try:
        chosen = from_args(args)    # the one settings object, handed to what needs it
    except SettingError as error:
        raise SystemExit(f"kubetune operator: {error}") from None
    return run(chosen)


def run(chosen: OperatorSettings) -> int:
    # Before Ray is imported: its C++ failure-signal handler takes SIGTERM (the kubelet's
    # stop) for a crash, spends ~1.5 s symbolizing a stack trace into the log, and ends the
    # process with SIGABRT (exit code 134) after kopf's clean shutdown.  The driver processes
    # inherit it.  A real crash (SIGSEGV) still ends the process, as a crash.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    import kopf

    from kubetune import handlers

    logging.basicConfig(level=chosen.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    protect_process()
    handlers.register(chosen)

    async def serve() -> None:
        server = None
        if chosen.metrics_port:
            from kubetune import metrics
            server = await metrics.serve(chosen.metrics_port)
        elector = health = None
        try:
            if chosen.leader_election:
                elector, health = await _lead(chosen)
            await kopf.operator(
                # namespaces=[] (not None) when cluster-wide: kopf's namespace observer
                # iterates it, and crashes (stopping the operator) on None
                clusterwide=not chosen.namespaces, namespaces=list(chosen.namespaces),
                # with leader election, our own endpoint serves liveness in both roles
                liveness_endpoint=None if elector else chosen.liveness or None, standalone=True)
        finally:
            if elector is not None:
                await elector.release()
            for runner in (health, server):
                if runner is not None:
                    await runner.cleanup()

    asyncio.run(serve())
    if chosen.ray_address != "local":
        # kopf's cleanup wrote what is to keep (results flushed, the ingest stopped, the
        # Lease given back).  What is left are Ray's atexit disconnect (ray.shutdown: ~2 s
        # of importing ray.dag) and threads blocked on Ray or the API server that hold the
        # exit.  Trials run on, as after a SIGKILL: the next operator re-attaches.  (An
        # embedded Ray, ``local``, is this process's to end: the normal exit ends it.)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def protect_process() -> None:
    """No other process of the operator's uid (a driver process, code in its pod) may
    ptrace it or read its memory or ``/proc/PID/environ``: its Ray token, results URL.
    Nothing the operator needs reads its own process that way (py-spy would, as root)."""
    from kubetune.sandbox import landlock
    if not landlock.not_dumpable():
        logging.getLogger(__name__).warning("cannot make the operator's process not dumpable (not Linux)")


async def _lead(chosen: OperatorSettings):
    """Wait (a standby) until this replica holds the Lease; returns (elector, health server)."""
    import importlib
    import os
    import socket
    from urllib.parse import urlparse

    from kubetune.k8s.client import load_config
    from kubetune.k8s.lease import LeaderElector, serve_health

    log = logging.getLogger("kubetune.leader")
    load_config()
    namespace = chosen.lease_namespace or os.environ.get("POD_NAMESPACE") or (chosen.namespaces or ("default",))[0]
    identity = chosen.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    duration = chosen.lease_duration_seconds
    elector = LeaderElector(namespace, chosen.lease_name, identity, lease_duration_s=duration,
                            renew_deadline_s=duration * RENEW_DEADLINE_S / LEASE_DURATION_S,
                            retry_period_s=duration * RETRY_PERIOD_S / LEASE_DURATION_S)
    health = None
    if chosen.liveness:
        url = urlparse(chosen.liveness)
        health = await serve_health(url.port or 8080, url.path or "/healthz", lambda: elector.leading)
    # what a new leader needs first, loaded while it waits: failover is not an import away
    await asyncio.to_thread(importlib.import_module, "kubetune.executors.ray.executor")
    if chosen.ray_address != "local":    # and connected: the executor the leader will use
        await asyncio.to_thread(_connect_ray, chosen, log)
    await elector.acquire()

    def lost(why: str) -> None:
        # stop driving before any standby may start: at once, no cleanup that could hang
        log.error("%s: exiting so that exactly one replica drives", why)
        logging.shutdown()
        os._exit(1)

    elector.keep_renewing(lost)
    return elector, health


def _connect_ray(chosen: OperatorSettings, log: logging.Logger) -> None:
    """A standby's Ray connection, in the executor the leader will use."""
    from kubetune.handlers import prepare_executor
    try:
        prepare_executor(chosen)
    except Exception as error:  # noqa: BLE001 - the leader connects (and reports) on its own
        log.warning("standby: cannot connect to Ray at %s yet: %s", chosen.ray_address, error)
