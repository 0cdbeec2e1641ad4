"""``kubetune operator``: run the kopf operator against the current KUBECONFIG
(or the in-cluster service account)."""
from __future__ import annotations

import argparse
import asyncio
import logging

from kubetune.settings import OperatorSettings, configure, env_fallback


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--ray-address", default=env_fallback("KUBETUNE_RAY_ADDRESS", "local"),
                        help="default Ray cluster: local (embedded), auto, or ray://host:10001")
    parser.add_argument("--checkpoint-storage", default=env_fallback("KUBETUNE_CHECKPOINT_STORAGE", ""),
                        help="default checkpoint storage when an Experiment names none")
    parser.add_argument("--log-level", default=env_fallback("KUBETUNE_LOG_LEVEL", "INFO"))
    parser.add_argument("--liveness", default="", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    # ports are flags only: KUBETUNE_METRICS_PORT and KUBETUNE_INGEST_PORT are the
    # service-link variables of the chart's own Services (kubetune.settings)
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="serve Prometheus metrics on http://0.0.0.0:PORT/metrics (0: off)")
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
    configure(OperatorSettings(ray_address=args.ray_address, checkpoint_storage=args.checkpoint_storage,
                               ingest_port=args.ingest_port, ingest_url=args.ingest_url,
                               results_url=args.results_url))
    import kubetune.handlers  # noqa: F401  (registers the handlers)

    async def run() -> None:
        server = None
        if args.metrics_port:
            from kubetune import metrics
            server = await metrics.serve(args.metrics_port)
        try:
            await kopf.operator(
                # namespaces=[] (not None) when cluster-wide: kopf's namespace observer
                # iterates it, and crashes (stopping the operator) on None
                clusterwide=not args.namespace, namespaces=args.namespace,
                liveness_endpoint=args.liveness or None, standalone=True)
        finally:
            if server is not None:
                await server.cleanup()

    asyncio.run(run())
    return 0
