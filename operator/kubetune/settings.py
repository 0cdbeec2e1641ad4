"""The operator's settings: command-line flags, with environment fallbacks only under
names no Kubernetes Service can produce.

The kubelet injects service-link variables for every Service of a pod's namespace
(unless the pod sets ``enableServiceLinks: false``): a Service ``kubetune-metrics``
defines ``KUBETUNE_METRICS_PORT=tcp://10.0.0.235:8080``, ``KUBETUNE_METRICS_SERVICE_HOST``,
``KUBETUNE_METRICS_PORT_8080_TCP_ADDR`` and so on.  An operator setting read from such a
name is overwritten by whatever Service happens to exist, so ``env_fallback`` refuses
those names outright, and the chosen settings reach the handlers through ``configure``
rather than through the process environment.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

# <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT[_<NAME>], <SVC>_PORT[_<N>_<PROTO>[_PROTO|_PORT|_ADDR]]
SERVICE_LINK_NAME = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$")


def service_link_name(name: str) -> bool:
    """Whether a Service could define an environment variable called ``name``."""
    return bool(SERVICE_LINK_NAME.match(name))


def env_fallback(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of setting ``name`` from the environment, or ``default``."""
    if service_link_name(name):
        raise ValueError(f"{name} is a name a Kubernetes Service can define (service links): "
                         "read this setting from a flag instead")
    environ = os.environ if environ is None else environ
    return environ.get(name) or default


@dataclass(frozen=True)
class OperatorSettings:
    ray_address: str = "local"
    checkpoint_storage: str = ""
    ingest_port: int = 8081
    ingest_url: str = ""
    results_url: str = ""      # the results store; "": kubetune.results.default_url()
    allow_local_ray: bool = False      # Ray address `local` inside a cluster (outside one it always is)
    trial_lease_seconds: float = 0.0   # a running Ray trial nobody calls this long ends itself (0: never)
    cleanup_timeout_seconds: float = 600.0   # an Experiment's deletion retries its cleanup this long
    pod_executor: bool = False                  # off: no ingest endpoint, pod Experiments refused
    pod_allow: frozenset[str] = frozenset()     # spec/pod_policy.py allowances for every trial pod
    pod_namespace_opt_in: bool = False          # namespaces may grant allowances by label


_current: OperatorSettings | None = None


def configure(settings: OperatorSettings | None) -> None:
    global _current
    _current = settings


def current() -> OperatorSettings:
    """What ``kubetune operator`` was started with (defaults when the handlers are run
    some other way, e.g. ``kopf run``)."""
    return _current or OperatorSettings(
        ray_address=env_fallback("KUBETUNE_RAY_ADDRESS", "local"),
        checkpoint_storage=env_fallback("KUBETUNE_CHECKPOINT_STORAGE", ""),
        ingest_url=env_fallback("KUBETUNE_INGEST_ADVERTISE_URL", ""),
        results_url=env_fallback("KUBETUNE_RESULTS_URL", ""))
