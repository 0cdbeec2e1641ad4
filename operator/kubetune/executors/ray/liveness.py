"""Noticing that the Ray cluster the operator is connected to went away, before Ray does.

Two behaviours of a Ray driver would end the operator's process when the Ray head
stops or restarts:

- a driver that loses its GCS waits ``gcs_rpc_server_reconnect_timeout_s`` (60 s by
  default) for it to come back, then terminates its own process;
- a GCS query made while the GCS is away blocks until a GCS answers at that address
  again; when that is a new cluster (the head restarted), a check inside Ray fails on
  the wrong cluster id and aborts the process.

So the operator sets that timeout far out before it connects (``prepare_driver_env``)
and, before each use of its connection, asks ``ClusterWatch.check``: is the GCS port
open, and does the same cluster (its session) answer there? If not, the executor
drops the connection and connects again once a cluster answers; the trials that ran
on the lost one are relaunched from their checkpoints as cluster faults, which do not
count against ``maxFailures``.

Before it connects at all, ``probe`` opens the address's port: an address nothing
answers at fails at once, saying why, instead of after ray.init's minutes of retries.
"""
from __future__ import annotations

import logging
import os
import socket
import time

import ray

from kubetune.executors.ray import ray_compat
from kubetune.executors.ray.errors import CLUSTER_RESTARTED, RayUnavailableError

log = logging.getLogger(__name__)

# Longer than any outage worth waiting through in-process: past it the operator's
# process ends and its Deployment starts a new one, which restores from the Trials.
GCS_RECONNECT_TIMEOUT_S = 7 * 24 * 3600
SESSION_CHECK_INTERVAL_S = 1.0
_SESSION_KEY, _SESSION_NAMESPACE = b"session_name", b"session"


def prepare_driver_env(address: str) -> None:
    """Before ``ray.init``: a lost GCS must not end the operator's process. Not for an
    embedded cluster (``local``), whose processes inherit the environment and whose GCS
    lives and dies with the operator.

    Setting the variable is not enough: Ray read its settings when it was imported, and
    ``ray.init`` makes the GCS client of its internal KV (every trial's answer is read
    through it, answers.py) before it reads them again.  That client kept the timeout
    the process started with (Ray's default, 60 s, or what its environment said), so a
    KV read in flight when the head stopped ended the operator that long after, with
    "Failed to connect to GCS within 604800 seconds" (the value read later) — Ray's
    src/ray/gcs_rpc_client/rpc_client.h, whose RetryableGrpcClient takes the timeout
    once, when it is made.  So Ray reads its settings again here, before ``ray.init``."""
    if address != "local":
        os.environ["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(GCS_RECONNECT_TIMEOUT_S)
        ray_compat.reload_settings_from_environment()


def probe(address: str, timeout_s: float) -> None:
    """Before ``ray.init``: fail fast on an unreachable ``host:port`` (ray.init would retry
    for minutes), saying what a user fixes: the name, the port, or the network."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return    # "auto" and the like: ray.init resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        if isinstance(exc, socket.gaierror):
            why = f"the host name {host} does not resolve ({exc.strerror or exc})"
        elif isinstance(exc, ConnectionRefusedError):
            why = f"connection refused: nothing listens on port {port} of {host}"
        elif isinstance(exc, (socket.timeout, TimeoutError)):
            why = f"no answer from {host}:{port} (timed out)"
        else:
            why = str(exc)
        raise RayUnavailableError(address, f"cannot open a connection to {target}: {why}") from exc


class ClusterWatch:
    """Watches the cluster of the current Ray connection (made with ``ray.init(address)``)."""

    def __init__(self, gcs_address: str, timeout_s: float = 2.0) -> None:
        self.gcs_address = gcs_address
        self.timeout_s = timeout_s
        host, _, port = gcs_address.rpartition(":")
        self._endpoint = (host, int(port))
        self._client = ray_compat.gcs_client(gcs_address)   # a client of its own: never Ray's blocking one
        self.session = self._session()
        self._checked_at = time.monotonic()

    @classmethod
    def attach(cls, timeout_s: float = 2.0) -> "ClusterWatch | None":
        """For the connection just made; None where there is nothing to watch this way
        (Ray Client connections, or if Ray's internals differ)."""
        try:
            if ray.util.client.ray.is_connected():
                return None
            return cls(ray.get_runtime_context().gcs_address, timeout_s)
        except Exception as exc:  # noqa: BLE001 - a watch is a safety net, not a requirement
            log.warning("cannot watch the Ray cluster for restarts: %s: %s", type(exc).__name__, exc)
            return None

    def _session(self) -> bytes | None:
        return self._client.internal_kv_get(_SESSION_KEY, _SESSION_NAMESPACE, timeout=self.timeout_s)

    @property
    def endpoint(self) -> tuple[str, int]:
        return self._endpoint

    def check(self) -> str:
        """"" while the cluster we connected to answers; else why it does not. The port
        probe is cheap and runs every time: a GCS query must never be made to a dead GCS;
        the session is compared at most every ``SESSION_CHECK_INTERVAL_S``."""
        try:
            socket.create_connection(self._endpoint, timeout=self.timeout_s).close()
        except OSError as exc:
            return f"the Ray GCS at {self.gcs_address} is unreachable: {exc}"
        if time.monotonic() - self._checked_at < SESSION_CHECK_INTERVAL_S:
            return ""
        try:
            session = self._session()
        except Exception as exc:  # noqa: BLE001 - any failure means: not our cluster now
            if CLUSTER_RESTARTED in str(exc):
                return f"the Ray cluster at {self.gcs_address} restarted: its trials are gone"
            return f"the Ray GCS at {self.gcs_address} does not answer as before: {type(exc).__name__}: {exc}"
        if session != self.session:
            return (f"the Ray cluster at {self.gcs_address} restarted (session "
                    f"{_text(self.session)} is now {_text(session)}): its trials are gone")
        self._checked_at = time.monotonic()
        return ""


def _text(value: bytes | None) -> str:
    return value.decode(errors="replace") if value else "none"
