"""Real Ray for integration tests: one local head for the whole session.

The head runs in its own process (``ray start --head --block``) rather than inside
pytest (``ray.init()``), so that a test can drop its connection (``ray.shutdown()``)
and connect again, as a restarted operator does, without ending the cluster.
Resources are logical (8 CPUs, 4 GPUs on a 2-core machine without GPUs); ports are
picked free so that another Ray on this machine is left alone.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from kubetune.devcluster.processes import free_port

__all__ = ["ray_local", "start_ray_head", "stop_ray_head"]

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def use_test_auth_token() -> str:
    """Token authentication with a token of this test session, in this process's
    environment so every Ray process and client the tests start (the operator
    included) shares it: a token left in ~/.ray/auth_token by another Ray on this
    machine must not decide whether the tests can connect."""
    import secrets
    token = os.environ.get("KUBETUNE_TEST_RAY_TOKEN") or secrets.token_hex(32)
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, KUBETUNE_TEST_RAY_TOKEN=token)
    return token


# At import, before any test module imports ray: Ray caches the token on first use.
use_test_auth_token()


def start_ray_head(num_cpus: int = 8, num_gpus: int = 4, timeout_s: float = 180.0,
                   port: int | None = None, resources: dict[str, float] | None = None,
                   client_port: int | None = None) -> tuple[subprocess.Popen, str, Path]:
    """Start a Ray head in a new process group; returns (process, address, temp dir).
    ``timeout_s``: on a loaded 2-core machine a head has taken over a minute to start.
    ``port``: the GCS port (default: a free one), e.g. to restart a head at its address.
    ``resources``: custom resources of the head (e.g. to tell two heads apart);
    ``client_port``: the Ray Client server's port (``ray://127.0.0.1:PORT``; default: a free one)."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = port or free_port()
    # A short path: Ray's unix sockets live under it and have a 107-byte limit.
    temp_dir = Path(tempfile.mkdtemp(prefix="kt-ray-", dir="/tmp"))
    use_test_auth_token()
    env = {**os.environ, **RAY_ENV}
    log = open(temp_dir / "head.log", "w")
    process = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}", "--include-dashboard=false",
         "--object-store-memory=80000000", f"--ray-client-server-port={client_port or free_port()}",
         f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-port={free_port()}",
         f"--temp-dir={temp_dir}", *([f"--resources={json.dumps(resources)}"] if resources else [])],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    address = f"127.0.0.1:{port}"
    if not wait_for_head(process, temp_dir / "head.log", timeout_s):
        stop_ray_head(process)
        raise RuntimeError("the Ray head did not come up in time: " + (temp_dir / "head.log").read_text()[-3000:])
    return process, address, temp_dir


def wait_for_head(process: subprocess.Popen, log_path: Path, timeout_s: float) -> bool:
    """Wait until ``ray start --head --block`` says it is up (True) or ``timeout_s`` passes
    (False: the caller ends what it started); RuntimeError at once if it exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited with {process.returncode}: " + log_path.read_text()[-3000:])
        if "This command will now block" in log_path.read_text():
            return True
        time.sleep(0.1)
    return False


def session_processes(session: int, marker: bytes | None = None) -> list[int]:
    """Live (not zombie) processes of one session (a Ray head's GCS, raylet, workers),
    and with ``marker`` any other whose command line names it (e.g. the head's temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if os.getsid(int(entry.name)) == session or marker is not None and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def end_processes(find, grace_s: float) -> list[int]:
    """What `ray stop` does, for one head only: SIGTERM to each of ``find()`` at once,
    SIGKILL to what is left after ``grace_s`` (`ray start --block` alone takes half a
    minute to wind down on SIGTERM); returns what is still there after that."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in find():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while find() and time.monotonic() < deadline:
            time.sleep(0.05)
    return find()


def stop_ray_head(process: subprocess.Popen) -> None:
    """End the head we started (its whole process group: raylet, GCS, workers)."""
    if process.poll() is None:
        process.terminate()            # `ray start --block` ends its children on SIGTERM
        try:
            # one by one and slowly (30 s and more); the group SIGKILL below ends the rest,
            # and the workers (process groups of their own) follow their raylet within ~2 s
            process.wait(5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)   # whatever of our group is left
    except ProcessLookupError:
        pass
    process.wait(10)


@pytest.fixture(scope="session")
def ray_local():
    """The address (``host:port``) of a running local Ray head, shared by the session."""
    process, address, temp_dir = start_ray_head()
    try:
        yield address
    finally:
        import ray
        if ray.is_initialized():
            ray.shutdown()
        stop_ray_head(process)
        shutil.rmtree(temp_dir, ignore_errors=True)
