"""Kubernetes client configuration: in-cluster when running as a Pod, else KUBECONFIG."""
from __future__ import annotations

import os
import threading

import kubernetes

GROUP = "kubetune.dev"
VERSION = "v1alpha1"
EXPERIMENTS = "experiments"
TRIALS = "trials"
EXPERIMENT_LABEL = "kubetune.dev/experiment"


def load_config() -> None:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


def in_cluster() -> bool:
    """Whether this process runs in a Kubernetes Pod (the kubelet sets this variable)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


# One client for every Experiment's store (k8s/store.py), with as many kept-alive
# connections as requests in flight: a client each (a pool of connections each) made
# every new Experiment open connections of its own, a TLS handshake each on both sides
# (10% of the API threads' time when 200 were applied at once, on a CPU-starved server).
# Made again when the configuration is loaded anew (another cluster: tests, benchmarks).
_shared: tuple[tuple, kubernetes.client.ApiClient] | None = None
_shared_lock = threading.Lock()


def custom_objects(connections: int | None = None) -> kubernetes.client.CustomObjectsApi:
    """The API of custom objects; with ``connections``, on the client shared by everyone
    asking so, which keeps that many connections alive."""
    if connections is None:
        return kubernetes.client.CustomObjectsApi()
    global _shared
    config = kubernetes.client.Configuration.get_default_copy()
    key = (config.host, repr(config.api_key), config.cert_file, config.key_file, config.ssl_ca_cert, connections)
    with _shared_lock:
        if _shared is None or _shared[0] != key:
            config.connection_pool_maxsize = connections
            _shared = (key, kubernetes.client.ApiClient(config))
        return kubernetes.client.CustomObjectsApi(_shared[1])
