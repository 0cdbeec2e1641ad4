"""``kubetune operator``: run the kopf operator against the current KUBECONFIG
(or the in-cluster service account)."""
from __future__ import annotations

import argparse
import asyncio
import logging

from kubetune.core.leadership import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S
from kubetune.settings import OperatorSettings, configure, env_fallback
from kubetune.spec.pod_policy import ALLOWANCES, unknown_allowances


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--ray-address", default=env_fallback("KUBETUNE_RAY_ADDRESS", "local"),
                        help="default Ray cluster: local (embedded), auto, or ray://host:10001")
    parser.add_argument("--allow-local-ray", action="store_true",
                        default=env_fallback("KUBETUNE_ALLOW_LOCAL_RAY", "") not in ("", "0", "false"),
                        help="inside a Kubernetes cluster, allow Ray address 'local' (trials then run in "
                             "the operator's pod, next to its ServiceAccount token); outside one it always is")
    parser.add_argument("--checkpoint-storage", default=env_fallback("KUBETUNE_CHECKPOINT_STORAGE", ""),
                        help="default checkpoint storage when an Experiment names none")
    parser.add_argument("--trial-lease-seconds", type=float,
                        default=float(env_fallback("KUBETUNE_TRIAL_LEASE_SECONDS", "900")),
                        help="a running Ray trial that no operator has called for this long stops and frees "
                             "its resources (its controller is gone); 0: never. Longer than any operator outage "
                             "you want trials to outlive")
    parser.add_argument("--leader-election", action="store_true",
                        default=env_fallback("KUBETUNE_LEADER_ELECTION", "") not in ("", "0", "false"),
                        help="run as one of several replicas: only the holder of a coordination.k8s.io Lease "
                             "drives Experiments; the others wait to take over")
    parser.add_argument("--lease-name", default="kubetune-operator", help="the Lease's name")
    parser.add_argument("--lease-duration-seconds", type=float, default=LEASE_DURATION_S,
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
    parser.add_argument("--pod-namespace-opt-in", action="store_true",
                        help="a namespace labelled pod-security.kubetune.dev/allow-<allowance>=true "
                             "allows that to its trial pods (the operator reads the namespace's labels)")
    parser.add_argument("--ingest-port", type=int, default=8081,
                        help="port of the endpoint trial pods (executor: pod) post their results to")
    parser.add_argument("--ingest-url", default=env_fallback("KUBETUNE_INGEST_ADVERTISE_URL", ""),
                        help="URL trial pods reach that endpoint at (default: the kubetune-ingest Service "
                             "in the operator's namespace, or http://127.0.0.1:PORT outside a cluster)")
    # an env fallback too, so a PostgreSQL URL (with its password) can come from a Secret
    parser.add_argument("--results-url", default=env_fallback("KUBETUNE_RESULTS_URL", ""),
                        help="results store: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB "
                             "(default: sqlite:///~/.local/share/kubetune/results.db)")


def main(args: argparse.Namespace) -> int:
    import kopf

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    allow = frozenset(name.strip() for item in args.pod_allow for name in item.split(",") if name.strip())
    if unknown_allowances(allow):
        raise SystemExit(f"--pod-allow: unknown {', '.join(unknown_allowances(allow))}; "
                         f"known: {', '.join(ALLOWANCES)}")
    configure(OperatorSettings(ray_address=args.ray_address, checkpoint_storage=args.checkpoint_storage,
                               ingest_port=args.ingest_port, ingest_url=args.ingest_url,
                               results_url=args.results_url, allow_local_ray=args.allow_local_ray,
                               trial_lease_seconds=args.trial_lease_seconds,
                               pod_executor=args.pod_executor, pod_allow=allow,
                               pod_namespace_opt_in=args.pod_namespace_opt_in))
    import kubetune.handlers  # noqa: F401  (registers the handlers)

    async def run() -> None:
        server = None
        if args.metrics_port:
            from kubetune import metrics
            server = await metrics.serve(args.metrics_port)
        elector = health = None
        try:
            if args.leader_election:
                elector, health = await _lead(args)
            await kopf.operator(
                # namespaces=[] (not None) when cluster-wide: kopf's namespace observer
                # iterates it, and crashes (stopping the operator) on None
                clusterwide=not args.namespace, namespaces=args.namespace,
                # with leader election, our own endpoint serves liveness in both roles
                liveness_endpoint=None if elector else args.liveness or None, standalone=True)
        finally:
            if elector is not None:
                await elector.release()
            for runner in (health, server):
                if runner is not None:
                    await runner.cleanup()

    asyncio.run(run())
    return 0


async def _lead(args: argparse.Namespace):
    """Wait (a standby) until this replica holds the Lease; returns (elector, health server)."""
    import importlib
    import os
    import socket
    from urllib.parse import urlparse

    from kubetune.k8s.client import load_config
    from kubetune.k8s.lease import LeaderElector, serve_health

    log = logging.getLogger("kubetune.leader")
    load_config()
    namespace = args.lease_namespace or os.environ.get("POD_NAMESPACE") or (args.namespace or ["default"])[0]
    identity = args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    duration = args.lease_duration_seconds
    elector = LeaderElector(namespace, args.lease_name, identity, lease_duration_s=duration,
                            renew_deadline_s=duration * RENEW_DEADLINE_S / LEASE_DURATION_S,
                            retry_period_s=duration * RETRY_PERIOD_S / LEASE_DURATION_S)
    health = None
    if args.liveness:
        url = urlparse(args.liveness)
        health = await serve_health(url.port or 8080, url.path or "/healthz", lambda: elector.leading)
    # what a new leader needs first, loaded while it waits: failover is not an import away
    await asyncio.to_thread(importlib.import_module, "kubetune.executors.ray.executor")
    if args.ray_address != "local":    # and connected: the executor the leader will use
        await asyncio.to_thread(_connect_ray, args.ray_address, log)
    await elector.acquire()

    def lost(why: str) -> None:
        # stop driving before any standby may start: at once, no cleanup that could hang
        log.error("%s: exiting so that exactly one replica drives", why)
        logging.shutdown()
        os._exit(1)

    elector.keep_renewing(lost)
    return elector, health


def _connect_ray(address: str, log: logging.Logger) -> None:
    """A standby's Ray connection, in the executor the leader will use."""
    from kubetune.handlers import prepare_executor
    try:
        prepare_executor(address)
    except Exception as error:  # noqa: BLE001 - the leader connects (and reports) on its own
        log.warning("standby: cannot connect to Ray at %s yet: %s", address, error)
