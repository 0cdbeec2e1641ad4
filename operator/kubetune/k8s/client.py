"""Kubernetes client configuration: in-cluster when running as a Pod, else KUBECONFIG."""
from __future__ import annotations

import os

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


def custom_objects() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi()
