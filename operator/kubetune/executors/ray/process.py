"""A Ray executor in a driver process of its own: how one operator serves several Ray
clusters (issue 15, item 6).

Why a process per cluster.  A Ray driver (``ray.init(address)``) is one per process,
and so is much of what goes with it: the auth token (``RAY_AUTH_TOKEN``, read once),
the GCS reconnect timeout (liveness.py), and the abort of the whole process when
the cluster behind a GCS address turns out to be another one.  Ray Client (``ray://``)
can hold several connections in one process (``ray.init(..., allow_multiple=True)``),
but only for ``ray://`` addresses (a GCS address, ``auto`` and ``local`` need a
driver), its "current" connection is thread-local and has to be entered around every
call on every thread of the operator's pool, and Ray calls it experimental.  A child
process per address serves every kind of address the same way, and whatever one
cluster does to its driver stays in that child: a typo, a hang, an abort fails only
the Experiments on that address.

The operator keeps its own in-process driver for the address it was started with
(``--ray-address``: a standby connects it ahead of leading, for a fast failover); each
other address gets a ``DriverProcess``, which has the executor's methods and runs them
in a child running ``RayExecutor``.  Calls go over a socket pair as pickled
``(id, method, args, kwargs)`` and run concurrently in threads of the child (the
executor is thread-safe), so a long poll does not hold up a stop.

The child talks to a Ray cluster the operator does not control (an allow-listed one,
by default a Service in the Experiment's own namespace: a tenant's), and Ray Client
unpickles what that cluster sends, so the child is not trusted either (issue 25, N2):
it starts with none of the operator's credentials (``scrubbed_environment``: no Ray
token, no results-store URL, nothing named like a secret; the token of its own cluster
if the allow-list names one), and it answers as bounded JSON that the operator checks
field by field (driver_wire.py); an answer that fails a check ends the child.  And
before it imports Ray it enters a sandbox (sandbox.py: Landlock) that leaves it its own
work directory, Python's files, and for a ``ray://`` address TCP to that port only: code a
hostile server runs there reads no ServiceAccount token, no other process's ``/proc``
entries, and can neither ptrace nor signal the operator.  The
child ends when the operator does (it reads end-of-file on its socket), so an operator that is killed
leaves no driver behind; trials are detached actors and outlive both.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from multiprocessing.connection import Connection
from typing import Any, Mapping

from kubetune.executors.base import ExecutorError, PlatformUnavailableError
from kubetune.executors.ray import driver_wire, workdirs
from kubetune.executors.ray.driver_wire import CONNECTION_ERRORS, WireError
from kubetune.executors.ray.errors import RayUnavailableError

log = logging.getLogger(__name__)

# ray.init on a loaded 2-core machine has taken tens of seconds; an unreachable
# host:port fails at once (the executor probes it first)
CONNECT_TIMEOUT_S = 120.0
# every other call bounds itself (rpc_timeout_s, a stop's timeout_s); past this the
# child is taken for wedged, ended, and started afresh at the next connect
CALL_TIMEOUT_S = 300.0
CALLS = frozenset({"connect", "disconnect", "start", "poll", "stop", "pause", "list_trials", "stop_all",
                   "remaining", "cluster_resources", "node_types", "request_resources", "logs", "describe"})
# what the operator's environment holds that no other cluster's driver may see: its own
# Ray token and results-store URL, and whatever is named like a credential
SECRET_ENVIRONMENT = frozenset({"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE", "KUBETUNE_RESULTS_URL",
                                "DATABASE_URL", "PGPASSWORD", "KUBECONFIG"})
# Ray's "uv run" hook walks the process tree from /proc, which the sandbox hides; a
# driver is never started by uv (the operator starts it)
SANDBOXED_RAY = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "_KEY", "AUTH", "_URL", "DSN")


class DriverProcess:
    """A ``TrialExecutor`` whose calls run in a child process's ``RayExecutor(address)``.
    ``options``: that executor's keyword arguments (JSON values)."""

    def __init__(self, address: str, options: Mapping[str, Any] | None = None, *,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, call_timeout_s: float = CALL_TIMEOUT_S,
                 token: str = "", sandbox: bool = True) -> None:
        self.address = address
        self._options = dict(options or {})
        self._token = token       # this cluster's own Ray token ("": none), never the operator's
        # False only where the kernel has no Landlock and the operator's admin allowed
        # drivers without it (--allow-unsandboxed-ray-drivers)
        self._sandbox = sandbox
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = call_timeout_s
        self._lock = threading.Lock()
        self._child: _Child | None = None

    def connect(self) -> None:
        """Start the child if it is not running, and connect it to Ray.  Idempotent."""
        with self._lock:
            if self._child is None or self._child.ended:
                self._child = _Child(self.address, self._options, scrubbed_environment(self._token), self._sandbox)
        self._call("connect", timeout_s=self._connect_timeout_s)

    def close(self) -> None:
        """End the child (its trials keep running, unless its Ray was ``local``)."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close()

    def gcs_endpoint(self) -> tuple[str, int] | None:
        """None: no GCS port for the platform to probe (outage.py) from here; the child
        watches its own cluster, and every call to it is bounded (``CALL_TIMEOUT_S``)."""
        return None

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.process.pid if child is not None and not child.ended else None

    def _call(self, method: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        child = self._child
        if child is None or child.ended:
            raise RayUnavailableError(self.address, child.ended if child is not None else "not connected")
        try:
            return child.call(method, args, kwargs, timeout_s or self._call_timeout_s)
        except FutureTimeout:
            log.error("the Ray driver process for %s did not answer %s in time: ending it", self.address, method)
            child.close()
            raise RayUnavailableError(self.address, f"its driver process did not answer {method} in time") from None

    @staticmethod
    def is_unavailable(error: BaseException) -> bool:
        """As ``RayExecutor.is_unavailable``, by name: Ray is not imported in this process
        for the driver processes' sake."""
        return isinstance(error, (PlatformUnavailableError, ConnectionError)) or type(error).__name__ in CONNECTION_ERRORS

    def disconnect(self) -> None:
        if self._child is not None and not self._child.ended:
            self._call("disconnect")

    def start(self, req):
        return self._call("start", req)

    def poll(self, cursors, *, wait_s: float = 0.0, limit: int = 1000):
        return self._call("poll", dict(cursors), wait_s=wait_s, limit=limit)

    def stop(self, trial_key: str, *, after_seq: int | None = None, timeout_s: float = 5.0):
        return self._call("stop", trial_key, after_seq=after_seq, timeout_s=timeout_s)

    def pause(self, trial_key: str, *, after_seq: int | None = None, timeout_s: float = 30.0):
        return self._call("pause", trial_key, after_seq=after_seq, timeout_s=timeout_s)

    def list_trials(self, prefix: str = "") -> list[str]:
        return self._call("list_trials", prefix)

    def stop_all(self, prefix: str) -> int:
        return self._call("stop_all", prefix)

    def remaining(self, prefix: str) -> int:
        return self._call("remaining", prefix)

    def cluster_resources(self):
        return self._call("cluster_resources")

    def node_types(self):
        return self._call("node_types")

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        return self._call("request_resources", bundles)

    def logs(self, trial_key: str, lines: int = 200) -> str:
        return self._call("logs", trial_key, lines)

    def describe(self, trial_key: str) -> dict | None:
        return self._call("describe", trial_key)


def scrubbed_environment(token: str = "", environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The operator's environment without its credentials; ``token``: the cluster's own."""
    environ = os.environ if environ is None else environ
    clean = {k: v for k, v in environ.items()
             if k not in SECRET_ENVIRONMENT and not any(word in k.upper() for word in SECRET_WORDS)}
    if token:
        clean.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    return clean


# -P: its working directory (a directory it may write) is not put on sys.path, where a
# package planted there would be imported before the driver enters its sandbox
DRIVER_COMMAND = (sys.executable, "-P", "-m", "kubetune.executors.ray.driver_main")


def child_environment(environment: Mapping[str, str], workdir: str) -> dict[str, str]:
    """A driver process's environment: ``environment`` (scrubbed), its work directory
    as its TMPDIR and HOME (the one place its sandbox lets it write)."""
    return {**environment, "TMPDIR": workdir, "HOME": workdir, **SANDBOXED_RAY}


class _Child:
    """One driver process and the calls waiting for its answers."""

    def __init__(self, address: str, options: Mapping[str, Any], environment: Mapping[str, str],
                 sandbox: bool = True) -> None:
        self.address = address
        # the one directory the child may write (its sandbox): its TMPDIR, HOME and working
        # directory (never on its sys.path: DRIVER_COMMAND)
        self.workdir = workdirs.new_workdir()
        ours, theirs = socket.socketpair()
        try:
            # the child's output is the operator's: its Ray warnings land in the operator log
            self.process = subprocess.Popen(
                [*DRIVER_COMMAND, str(theirs.fileno()),
                 json.dumps({"address": address, **options, "workdir": self.workdir, "sandbox": sandbox})],
                pass_fds=(theirs.fileno(),), cwd=self.workdir,
                env=child_environment(environment, self.workdir))
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        self._pending: dict[int, tuple[Future, str, tuple, dict]] = {}   # the call each waits for
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self.ended = ""     # why the child is gone ("" while it runs)
        threading.Thread(target=self._read, name=f"ray-driver {address}", daemon=True).start()

    def call(self, method: str, args: tuple, kwargs: dict, timeout_s: float) -> Any:
        future: Future = Future()
        with self._send_lock:
            if self.ended:
                raise RayUnavailableError(self.address, self.ended)
            call_id = next(self._ids)
            self._pending[call_id] = (future, method, args, kwargs)
            try:
                self._conn.send((call_id, method, args, kwargs))
            except (OSError, ValueError) as exc:
                self._pending.pop(call_id, None)
                raise RayUnavailableError(self.address, f"its driver process is gone: {exc}") from exc
        try:
            ok, value = future.result(timeout_s)
        finally:
            self._pending.pop(call_id, None)
        if ok:
            return value
        raise value

    def _read(self) -> None:
        while True:
            try:
                data = self._conn.recv_bytes(driver_wire.MAX_ANSWER_BYTES)
            except (EOFError, OSError):
                break      # gone, or an answer too large: the child is ended below
            try:
                call_id, ok, value = driver_wire.read_envelope(data)
                waiting = self._pending.get(call_id)
                if waiting is not None:
                    future, method, args, kwargs = waiting
                    answer = driver_wire.decode(method, value, args, kwargs) if ok \
                        else driver_wire.decode_error(value, self.address, method)
                    if not future.done():
                        future.set_result((ok, answer))
            except WireError as exc:
                # a child that answers what kubetune's executor never sends is not trusted again
                log.error("the Ray driver process for %s sent an answer the operator does not take (%s): "
                          "ending it", self.address, exc)
                self.process.kill()
                break
        try:
            code = self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        with self._send_lock:
            self.ended = f"its driver process exited (code {code})"
            pending, self._pending = [waiting[0] for waiting in self._pending.values()], {}
        for future in pending:
            if not future.done():
                future.set_result((False, RayUnavailableError(self.address, self.ended)))
        self._conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()     # wakes the reader, which fails what waits


# ---------------------------------------------------------------- the child

def serve(conn: Connection, executor: Any) -> None:
    """Answer calls until the operator closes its end (as JSON: driver_wire.py)."""
    send_lock = threading.Lock()
    pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="ray-call")

    def answer(call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        try:
            if method not in CALLS:
                raise ExecutorError(f"no executor call {method!r}")
            payload = driver_wire.envelope(call_id, True, getattr(executor, method)(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            payload = driver_wire.envelope(call_id, False, exc)
        with send_lock:
            try:
                conn.send_bytes(payload)
            except OSError:
                pass     # the operator is gone; the loop below ends

    while True:
        try:
            call_id, method, args, kwargs = conn.recv()     # the operator's own pickles
        except (EOFError, OSError):
            return
        pool.submit(answer, call_id, method, args, kwargs)


def main(fd: int, settings: dict, sandboxed: bool) -> None:
    """The child's body, once in its sandbox (driver_main.py)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not sandboxed:
        log.warning("the Ray driver process for %s runs without a sandbox (--allow-unsandboxed-ray-drivers)",
                    settings["address"])
    from kubetune.executors.ray.executor import RayExecutor
    address = settings.pop("address")
    settings.pop("workdir")
    executor = RayExecutor(address, **settings)
    serve(Connection(fd), executor)
    if address == "local":   # an embedded Ray is this process's: end it with us
        executor.disconnect()
    os._exit(0)     # threads still waiting on Ray must not hold the exit
