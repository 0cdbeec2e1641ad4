"""The operator's settings: one frozen ``OperatorSettings``, built once by
``kubetune operator`` (operator_main.py) from its flags and passed explicitly to what
needs it (handlers.register); nothing reads them from the process environment later.

Flags have environment fallbacks only under names no Kubernetes Service can produce.
The kubelet injects service-link variables for every Service of a pod's namespace
(unless the pod sets ``enableServiceLinks: false``): a Service ``kubetune-metrics``
defines ``KUBETUNE_METRICS_PORT=tcp://10.0.0.235:8080``, ``KUBETUNE_METRICS_SERVICE_HOST``,
``KUBETUNE_METRICS_PORT_8080_TCP_ADDR`` and so on.  An operator setting read from such a
name is overwritten by whatever Service happens to exist, so ``env_fallback`` refuses
those names outright.

Imports: the standard library, spec/ and core/ only (pure).
"""
from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kubetune.core.leadership import LEASE_DURATION_S
from kubetune.spec import ray_allowlist
from kubetune.spec.pod_policy import ALLOWANCES, unknown_allowances

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


class SettingError(ValueError):
    """A setting's value is not valid; the message names the setting (its flag)."""


@dataclass(frozen=True)
class OperatorSettings:
    namespaces: tuple[str, ...] = ()       # watched namespaces; (): all
    ray_address: str = "local"
    allow_local_ray: bool = False      # Ray address `local` inside a cluster (outside one it always is)
    checkpoint_storage: str = ""
    trial_lease_seconds: float = 900.0  # a running Ray trial nobody calls this long ends itself (0: never)
    cleanup_timeout_seconds: float = 600.0   # an Experiment's deletion retries its cleanup this long
    results_url: str = ""      # the results store; "": kubetune.results.default_url()
    results_retention_days: float = 0.0   # finished Experiments first seen this long ago are removed (0: never)
    log_level: str = "INFO"
    liveness: str = ""         # kopf liveness endpoint URL ("": none)
    metrics_port: int = 0      # 0: no metrics endpoint
    ray_driver_idle_seconds: float = 300.0   # a driver process no Experiment needs this long ends
    # the Ray clusters an Experiment may name besides --ray-address (spec/ray_allowlist.py)
    ray_allowed_addresses: tuple[ray_allowlist.Entry, ...] = ray_allowlist.parse(ray_allowlist.DEFAULT)
    max_ray_drivers: int = 8                 # driver processes (other clusters) at once; then Experiments wait
    allow_unsandboxed_ray_drivers: bool = False   # start them where the kernel has no Landlock
    pod_executor: bool = False                  # off: no ingest endpoint, pod Experiments refused
    pod_allow: frozenset[str] = frozenset()     # spec/pod_policy.py allowances for every trial pod
    pod_namespace_opt_in: bool = False          # namespaces may grant allowances by label
    pod_priority_classes: frozenset[str] = frozenset()   # Kueue WorkloadPriorityClasses spec.priorityClass may name
    ingest_port: int = 8081
    ingest_url: str = ""
    leader_election: bool = False
    lease_name: str = "kubetune-operator"
    lease_duration_seconds: float = LEASE_DURATION_S
    lease_namespace: str = ""
    identity: str = ""
    dashboard_url: str = ""    # the chart's dashboard as users reach it: status.dashboard ("": none)
    namespace_weights: tuple[tuple[str, float], ...] = ()   # fair sharing of a Ray cluster (core/fair_share.py)
    kube_api_qps: float = 50.0     # client-side rate limit of the operator's API requests (k8s/rate_limit.py)
    kube_api_burst: int = 100


# the environment variable a flag falls back to (operator_main.py), named in errors
ENVIRONMENT = {"ray_address": "KUBETUNE_RAY_ADDRESS", "allow_local_ray": "KUBETUNE_ALLOW_LOCAL_RAY",
               "checkpoint_storage": "KUBETUNE_CHECKPOINT_STORAGE",
               "trial_lease_seconds": "KUBETUNE_TRIAL_LEASE_SECONDS",
               "ray_driver_idle_seconds": "KUBETUNE_RAY_DRIVER_IDLE_SECONDS",
               "results_retention_days": "KUBETUNE_RESULTS_RETENTION_DAYS",
               "leader_election": "KUBETUNE_LEADER_ELECTION", "log_level": "KUBETUNE_LOG_LEVEL",
               "ingest_url": "KUBETUNE_INGEST_ADVERTISE_URL",
               "allow_unsandboxed_ray_drivers": "KUBETUNE_ALLOW_UNSANDBOXED_RAY_DRIVERS"}


def _flag(name: str) -> str:
    flag = "--" + name.replace("_", "-")
    return f"{flag} (or ${ENVIRONMENT[name]})" if name in ENVIRONMENT else flag


def _checked(name: str, raw: Any, convert: Callable[[Any], Any], ok: Callable[[Any], bool], want: str) -> Any:
    try:
        value = convert(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not ok(value):
        raise SettingError(f"{_flag(name)}: {raw!r} is not {want}")
    return value


def _seconds(name: str, raw: Any) -> float:
    return _checked(name, raw, float, lambda v: math.isfinite(v) and v >= 0, "a number of seconds >= 0")


def _port(name: str, raw: Any) -> int:
    return _checked(name, raw, int, lambda v: 0 <= v <= 65535, "a port number 0-65535")


def _flag_bool(raw: Any) -> bool:
    """A boolean flag's value, which may come from an environment variable's text."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return False
    if text in ("1", "true", "yes", "on"):
        return True
    raise ValueError(text)


def _allowed(items: Any) -> tuple[ray_allowlist.Entry, ...]:
    try:
        return ray_allowlist.parse(ray_allowlist.DEFAULT if items is None else items)
    except ValueError as exc:
        raise SettingError(f"--ray-allowed-addresses: {exc}") from None


MAX_RAY_DRIVERS = 256


def from_args(args: Any) -> OperatorSettings:
    """The settings of ``kubetune operator``'s parsed command line (operator_main.py);
    raises ``SettingError`` naming the first setting whose value is not valid."""
    allow = frozenset(name.strip() for item in args.pod_allow for name in item.split(",") if name.strip())
    if unknown_allowances(allow):
        raise SettingError(f"--pod-allow: unknown {', '.join(unknown_allowances(allow))}; "
                           f"known: {', '.join(ALLOWANCES)}")
    level = str(args.log_level).upper()
    if not isinstance(logging.getLevelName(level), int):
        raise SettingError(f"{_flag('log_level')}: {args.log_level!r} is not a logging level (DEBUG, INFO, WARNING, ERROR)")
    if not str(args.ray_address).strip():
        raise SettingError(f"{_flag('ray_address')}: empty (local, auto, or ray://host:10001)")
    lease = _seconds("lease_duration_seconds", args.lease_duration_seconds)
    if lease <= 0:
        raise SettingError(f"--lease-duration-seconds: {args.lease_duration_seconds!r} is not > 0")
    return OperatorSettings(
        namespaces=tuple(args.namespace),
        ray_address=str(args.ray_address).strip(),
        allow_local_ray=_checked("allow_local_ray", args.allow_local_ray, _flag_bool, lambda v: True, "true or false"),
        checkpoint_storage=args.checkpoint_storage,
        trial_lease_seconds=_seconds("trial_lease_seconds", args.trial_lease_seconds),
        ray_driver_idle_seconds=_seconds("ray_driver_idle_seconds", args.ray_driver_idle_seconds),
        ray_allowed_addresses=_allowed(getattr(args, "ray_allowed_addresses", None)),
        max_ray_drivers=_checked("max_ray_drivers", getattr(args, "max_ray_drivers", 8), int,
                                 lambda v: 1 <= v <= MAX_RAY_DRIVERS, f"a number of processes 1-{MAX_RAY_DRIVERS}"),
        allow_unsandboxed_ray_drivers=_checked("allow_unsandboxed_ray_drivers",
                                               getattr(args, "allow_unsandboxed_ray_drivers", False), _flag_bool,
                                               lambda v: True, "true or false"),
        results_url=args.results_url,
        results_retention_days=_checked("results_retention_days", getattr(args, "results_retention_days", 0),
                                        float, lambda v: math.isfinite(v) and v >= 0, "a number of days >= 0"),
        log_level=level,
        liveness=args.liveness,
        metrics_port=_port("metrics_port", args.metrics_port),
        pod_executor=bool(args.pod_executor),
        pod_allow=allow,
        pod_namespace_opt_in=bool(args.pod_namespace_opt_in),
        pod_priority_classes=frozenset(name.strip() for item in getattr(args, "pod_priority_classes", []) or []
                                       for name in item.split(",") if name.strip()),
        ingest_port=_port("ingest_port", args.ingest_port),
        ingest_url=args.ingest_url,
        leader_election=_checked("leader_election", args.leader_election, _flag_bool, lambda v: True,
                                 "true or false"),
        lease_name=args.lease_name,
        lease_duration_seconds=lease,
        lease_namespace=args.lease_namespace,
        identity=args.identity,
        dashboard_url=_dashboard_url(getattr(args, "dashboard_url", "")),
        namespace_weights=namespace_weights(getattr(args, "namespace_weight", []) or []),
        kube_api_qps=_checked("kube_api_qps", getattr(args, "kube_api_qps", 50), float,
                              lambda v: math.isfinite(v) and 0 < v <= 10_000, "a number of requests a second in (0, 10000]"),
        kube_api_burst=_checked("kube_api_burst", getattr(args, "kube_api_burst", 100), int,
                                lambda v: 1 <= v <= 100_000, "a whole number of requests from 1 to 100000"))


NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_WEIGHT = 1000.0


def namespace_weights(items: list[str]) -> tuple[tuple[str, float], ...]:
    """``--namespace-weight team-a=2,team-b=0.5``: each namespace's weight in fair sharing."""
    weights: dict[str, float] = {}
    for item in (part.strip() for raw in items for part in str(raw).split(",")):
        if not item:
            continue
        namespace, _, raw = item.partition("=")
        namespace = namespace.strip()
        if not NAMESPACE.match(namespace) or len(namespace) > 63:
            raise SettingError(f"--namespace-weight: {item[:80]!r}: {namespace[:70]!r} is not a namespace name "
                               "(expected NAMESPACE=WEIGHT, e.g. team-a=2)")
        try:
            weight = float(raw)
        except ValueError:
            weight = float("nan")
        if not (0 < weight <= MAX_WEIGHT):
            raise SettingError(f"--namespace-weight: {item[:80]!r}: the weight must be a number > 0 and "
                               f"<= {MAX_WEIGHT:g} (expected NAMESPACE=WEIGHT, e.g. team-a=2)")
        weights[namespace] = weight
    return tuple(sorted(weights.items()))


MAX_DASHBOARD_URL = 512


def _dashboard_url(value: str) -> str:
    """``--dashboard-url``: "" or an http(s) URL (written into every Experiment's status)."""
    value = str(value or "").strip()
    if value and (not re.match(r"^https?://[^\s/?#]+(/[^\s?#]*)?$", value) or len(value) > MAX_DASHBOARD_URL):
        raise SettingError(f"--dashboard-url: {value[:100]!r} is not an http(s) URL of at most {MAX_DASHBOARD_URL} "
                           "characters without query or fragment, e.g. https://tuning.example.com")
    return value.rstrip("/")
