"""Kubernetes client configuration: in-cluster when running as a Pod, else KUBECONFIG."""
from __future__ import annotations

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


def custom_objects() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi()
