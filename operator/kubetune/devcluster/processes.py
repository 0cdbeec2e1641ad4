"""Start and stop the component processes, by pid, safely.

A pid alone is not an identity: after a reboot or a long time it may belong to
another program.  Each record also keeps the process's start time (from
/proc/<pid>/stat), and ``stop`` only signals a pid whose start time still matches.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after it
    return int(stat.rsplit(")", 1)[1].split()[19])


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@dataclass
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int | None
    log: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ProcessRecord":
        return cls(**data)

    def is_alive(self) -> bool:
        if not Path("/proc").is_dir():  # no procfs: best effort
            try:
                os.kill(self.pid, 0)
                return True
            except ProcessLookupError:
                return False
        ticks = _start_ticks(self.pid)
        return ticks is not None and ticks == self.start_ticks and not _is_zombie(self.pid)

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = Path(self.log).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    # Linux only: the kernel sends SIGTERM when the spawning thread exits, so a
    # test session killed with SIGKILL does not leave a control plane behind
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(name: str, argv: list[str], log_path: Path, *, die_with_parent: bool = False) -> tuple[ProcessRecord, subprocess.Popen]:
    """Start ``argv`` in its own session with stdout+stderr going to ``log_path``."""
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal that ran `up` does not reach it
            preexec_fn=_die_with_parent if die_with_parent and os.uname().sysname == "Linux" else None,
        )
    return ProcessRecord(name, proc.pid, _start_ticks(proc.pid), str(log_path)), proc


def stop(record: ProcessRecord, proc: subprocess.Popen | None = None, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; returns once the process is gone."""
    if not record.is_alive():
        if proc is not None:
            proc.poll()  # reap
        return
    _signal(record, signal.SIGTERM)
    if _wait_gone(record, proc, timeout):
        return
    _signal(record, signal.SIGKILL)
    if not _wait_gone(record, proc, 10.0):
        raise RuntimeError(f"{record.name} (pid {record.pid}) survived SIGKILL")


def terminate(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM a child of this process, SIGKILL after ``grace_s``; returns once it is reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _signal(record: ProcessRecord, sig: int) -> None:
    try:
        os.kill(record.pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(record: ProcessRecord, proc: subprocess.Popen | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            try:
                proc.wait(timeout=0.05)
                return True
            except subprocess.TimeoutExpired:
                pass
        elif not record.is_alive():
            return True
        else:
            time.sleep(0.05)
    return not record.is_alive()


def http_ok(url: str) -> bool:
    """``url`` answers 200 (a component's /readyz on loopback)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:   # refused, timed out, or an HTTPError (not ready yet)
        return False


class HostProcess:
    """One helper process a control plane runs beside it on the host (kwok, Kueue's
    manager, the KubeRay operator): its kubeconfig, a state directory for its config,
    log and record, and the one start/wait/stop/log-tail implementation they share.

    ``start`` (a subclass's) calls ``_spawn`` and then ``wait_until``; ``attach`` finds a
    process ``devcluster up`` left running through the record in ``state_dir``."""

    name = "process"                  # in messages and the record
    log_name = "process.log"          # in state_dir
    record_name: str | None = None    # in state_dir, for `devcluster down`; None: not recorded
    log_lines = 25                    # of the log in an error
    # what ``wait_until`` raises when the process exits, or the deadline passes
    exited_error: type[Exception] = RuntimeError
    timeout_error: type[Exception] = TimeoutError

    def __init__(self, kubeconfig: str | Path, state_dir: str | Path, *, die_with_parent: bool = True,
                 log: Callable[[str], None] = print) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.state_dir = Path(state_dir)
        self.die_with_parent = die_with_parent
        self.log = log
        self.record: ProcessRecord | None = None
        self._popen: subprocess.Popen | None = None

    def _spawn(self, argv: list[str]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.record, self._popen = spawn(self.name, argv, self.state_dir / self.log_name,
                                         die_with_parent=self.die_with_parent)
        if self.record_name is not None:
            (self.state_dir / self.record_name).write_text(json.dumps(self.record.to_dict()))

    def _load_record(self) -> bool:
        """Read the record ``_spawn`` wrote (another process started it); False if none."""
        if self.record_name is None:
            return False
        try:
            self.record = ProcessRecord.from_dict(json.loads((self.state_dir / self.record_name).read_text()))
        except (OSError, ValueError, TypeError):
            return False
        return True

    def log_tail(self) -> str:
        return self.record.log_tail(self.log_lines) if self.record is not None else "(not started)"

    def exited(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is not None
        return self.record is None or not self.record.is_alive()

    def wait_until(self, deadline: float, check: Callable[[], bool], what: str, *, interval: float = 0.2) -> None:
        """Poll ``check`` until it holds; raise ``exited_error`` as soon as the process is
        gone (its log tail says why), ``timeout_error`` after ``deadline`` (monotonic)."""
        while not check():
            if self.exited():
                code = f" with code {self._popen.returncode}" if self._popen is not None else ""
                raise self.exited_error(f"{self.name} exited{code} while waiting until {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise self.timeout_error(f"{self.name}: not {what} in time:\n{self.log_tail()}")
            time.sleep(interval)

    def stop(self) -> None:
        if self.record is not None:
            stop(self.record, self._popen)
            self.record = None
        if self.record_name is not None:
            (self.state_dir / self.record_name).unlink(missing_ok=True)
