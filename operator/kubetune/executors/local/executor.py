"""``LocalExecutor``: each trial attempt is a subprocess of this host, the process a
trial pod runs, without the pod.

An attempt runs ``python -m kubetune.trainable.run_entrypoint <entrypoint>`` (the
function, or a Ray Tune function or Trainable) with the environment the pod executor
gives a pod (trainable/pod_session.py reads it), in ``metricsCollector: stdout`` mode:
``kubetune.report()`` prints each result as a ``KUBETUNE_RESULT`` line and a thread
here reads them with the parser of the pod executor's log reader
(executors/pods/stdout_results.py: bounded lines, checked values, the n-th result line
is seq ``start_seq + n``).  The exit status says how it ended; the error is the
program's own first line (run_entrypoint's termination message) and the tail of its
stderr.  A stop ends the process group (SIGTERM, then SIGKILL); a pause is a stop
whose trial resumes from its last checkpoint, as with pods.
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from kubetune.executors.base import (ClusterResources, ExecutorError, LaunchInfo, LaunchRequest, NodeResources,
                                     TrialState, TrialUpdate)
from kubetune.executors.pods import spec as pod_spec
from kubetune.executors.pods.ingest import MAX_CHECKPOINT_CHARS
from kubetune.executors.pods.stdout_results import LogLines, MalformedLine, ResultLine, ResultLines
from kubetune.spec.results import Result

MAX_BUFFERED = 10_000        # results read and not yet polled: the reader waits (the trial's pipe fills)
ERROR_TAIL_BYTES = 64 * 1024  # of the attempt's stderr, in its failure
OUTPUT_LINES = 200           # the program's own output lines kept for ``logs``


@dataclass
class Attempt:
    """One trial attempt's process and what it said."""
    key: str
    attempt: int
    process: subprocess.Popen
    workdir: str
    started: float                    # epoch seconds (this host's clock, as usage counts)
    results: list[Result] = field(default_factory=list)   # read, not yet acknowledged by a poll
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=OUTPUT_LINES))
    checkpoint: str | None = None
    iteration: int | None = None
    read_all: bool = False            # the reader reached the end of stdout
    stopped: bool = False             # ended by stop/pause, not by itself
    ended: float | None = None


class LocalExecutor:
    """The ``TrialExecutor`` of trials run as processes on this host."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._attempts: dict[str, Attempt] = {}
        self._lock = threading.Condition()
        # each trial has a process group of its own (so a stop ends what it started too), so
        # Ctrl-C does not reach it: the trials end with this process
        atexit.register(self.stop_all, "")

    # ---------------------------------------------------------------- connection

    def connect(self) -> None:
        """Nothing to connect to: this host is always there."""

    def disconnect(self) -> None:
        self.stop_all("")

    def is_unavailable(self, error: BaseException) -> bool:
        return False

    # ---------------------------------------------------------------- start

    def start(self, req: LaunchRequest) -> LaunchInfo:
        with self._lock:
            running = self._attempts.get(req.trial_key)
        if running is not None and running.attempt == req.attempt and running.process.poll() is None:
            return LaunchInfo(req.trial_key, f"pid {running.process.pid}", attached=True)
        if running is not None:
            self.stop(req.trial_key)
        if not req.entrypoint:
            raise ExecutorError("spec.trial.entrypoint: required to run a trial as a local process")
        workdir = tempfile.mkdtemp(prefix="kubetune-trial-")
        with open(os.path.join(workdir, "config.json"), "w") as handle:
            json.dump(dict(req.config), handle)
        with open(os.path.join(workdir, "stderr"), "wb") as stderr:
            process = subprocess.Popen(
                [self.python, "-m", "kubetune.trainable.run_entrypoint", req.entrypoint],
                env=self._environment(req, workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=stderr, start_new_session=True)   # its own process group: a stop ends what it started too
        run = Attempt(req.trial_key, req.attempt, process, workdir, started=time.time())
        with self._lock:
            self._attempts[req.trial_key] = run
        threading.Thread(target=self._read, args=(run, ResultLines(req.start_seq + 1, req.start_iteration,
                                                                   req.attempt)),
                         daemon=True, name=f"kubetune-local-{req.trial_key}").start()
        return LaunchInfo(req.trial_key, f"pid {process.pid}", attached=False)

    def _environment(self, req: LaunchRequest, workdir: str) -> dict[str, str]:
        """A trial pod's environment (pods/spec.py), its results printed, plus this host's:
        the same kubetune and user code as this process imports, and where its error goes."""
        return {**os.environ, **pod_spec.trial_env(req, os.path.join(workdir, "config.json"), "stdout"),
                "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
                "KUBETUNE_TERMINATION_LOG": os.path.join(workdir, "termination")}

    def _read(self, run: Attempt, lines: ResultLines) -> None:
        """The attempt's stdout, to its end: results into ``run.results``, the rest kept as output."""
        splitter = LogLines()
        stream = run.process.stdout
        while True:
            chunk = os.read(stream.fileno(), 64 * 1024)
            for line, overlong in splitter.feed(chunk) if chunk else splitter.finish():
                self._take(run, lines.feed(line, overlong), line)
            if not chunk:
                break
        stream.close()
        with self._lock:
            run.read_all = True
            self._lock.notify_all()

    def _take(self, run: Attempt, item: ResultLine | MalformedLine | None, line: str) -> None:
        if not isinstance(item, ResultLine):
            run.output.append(line[:1000] if item is None else f"(not a result: {item.problem}) {line[:200]}")
            return
        body = item.body
        if body.get("checkpoint") is not None and len(body["checkpoint"]) > MAX_CHECKPOINT_CHARS:
            body = {**body, "checkpoint": None}
        result = Result.from_wire(body, now=time.time())
        with self._lock:
            # back-pressure: a trial reporting faster than the operator polls waits here
            self._lock.wait_for(lambda: len(run.results) < MAX_BUFFERED or run.stopped, timeout=None)
            run.results.append(result)
            run.iteration = result.iteration
            run.checkpoint = result.checkpoint or run.checkpoint
            self._lock.notify_all()     # a long poll waits for this

    # ---------------------------------------------------------------- poll

    def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0, limit: int = 1000) -> dict[str, TrialUpdate]:
        with self._lock:
            if wait_s > 0 and not any(self._news(key, after) for key, after in cursors.items()):
                self._lock.wait(wait_s)
            return {key: self._update(key, after, limit) for key, after in cursors.items()}

    def _news(self, key: str, after: int) -> bool:
        run = self._attempts.get(key)
        return run is None or run.read_all or any(r.seq > after for r in run.results[-1:])

    def _update(self, key: str, after: int, limit: int) -> TrialUpdate:
        run = self._attempts.get(key)
        if run is None:
            return TrialUpdate(key, TrialState.MISSING, error="no process of this trial runs on this host")
        run.results = [r for r in run.results if r.seq > after]     # the rest was recorded
        self._lock.notify_all()
        results = tuple(run.results[:limit])
        state, error = TrialState.RUNNING, ""
        if run.read_all and len(results) == len(run.results) and run.process.poll() is not None:
            run.ended = run.ended or time.time()
            state, error = self._ending(run)
        return TrialUpdate(key, state, results, error, attempt=run.attempt, checkpoint=run.checkpoint,
                           iteration=run.iteration, run_started=run.started, run_ended=run.ended)

    def _ending(self, run: Attempt) -> tuple[TrialState, str]:
        if run.stopped:
            return TrialState.STOPPED, ""
        if run.process.returncode == 0:
            return TrialState.COMPLETED, ""
        if run.process.returncode < 0:     # killed from outside (the OOM killer, a user): gone, as a lost node
            return TrialState.MISSING, (f"ProcessKilled: the trial's process (pid {run.process.pid}) ended by "
                                        f"signal {-run.process.returncode}")
        first = _tail(os.path.join(run.workdir, "termination"), 4000).strip()
        stderr = _tail(os.path.join(run.workdir, "stderr"), ERROR_TAIL_BYTES)
        if not first:
            first = f"ProcessExited: the trial's process ended with status {run.process.returncode}"
        return TrialState.FAILED, f"{first}\n{stderr}"

    # ---------------------------------------------------------------- stop

    def stop(self, trial_key: str, *, after_seq: int | None = None, timeout_s: float = 5.0) -> TrialUpdate | None:
        """End the attempt's process group; with ``after_seq`` the results it sent first."""
        with self._lock:
            run = self._attempts.pop(trial_key, None)
            if run is None:
                return None
            run.stopped = True
            self._lock.notify_all()
        _end_group(run.process, timeout_s)
        with self._lock:
            self._lock.wait_for(lambda: run.read_all, timeout=timeout_s)
            run.ended = run.ended or time.time()
            results = tuple(r for r in run.results if after_seq is not None and r.seq > after_seq)
        shutil.rmtree(run.workdir, ignore_errors=True)    # its checkpoints are in the storage, not here
        return TrialUpdate(trial_key, TrialState.STOPPED, results, attempt=run.attempt, checkpoint=run.checkpoint,
                           iteration=run.iteration, run_started=run.started, run_ended=run.ended)

    def pause(self, trial_key: str, *, after_seq: int | None = None, timeout_s: float = 30.0) -> TrialUpdate | None:
        """A process is not kept in memory: it ends, and resumes from its last checkpoint."""
        return self.stop(trial_key, after_seq=after_seq, timeout_s=timeout_s)

    def list_trials(self, prefix: str = "") -> list[str]:
        with self._lock:
            return [key for key, run in self._attempts.items() if key.startswith(prefix) and run.process.poll() is None]

    def stop_all(self, prefix: str) -> int:
        with self._lock:
            keys = [key for key in self._attempts if key.startswith(prefix)]
        for key in keys:
            self.stop(key)
        return 0

    # ---------------------------------------------------------------- the host

    def cluster_resources(self) -> ClusterResources:
        """This host's CPUs and memory (no GPU: a trial that asks for one is infeasible here)."""
        total = {"CPU": float(os.cpu_count() or 1),
                 "memory": float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))}
        return ClusterResources(total, dict(total), [NodeResources("local", "127.0.0.1", total, dict(total))])

    def logs(self, trial_key: str, lines: int = 200) -> str:
        with self._lock:
            run = self._attempts.get(trial_key)
            return "\n".join(list(run.output)[-lines:]) if run is not None else ""

    def describe(self, trial_key: str) -> dict | None:
        with self._lock:
            run = self._attempts.get(trial_key)
            return None if run is None else {"pid": run.process.pid, "attempt": run.attempt,
                                             "alive": run.process.poll() is None}

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        """This host does not grow."""


def _end_group(process: subprocess.Popen, timeout_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: str, size: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(os.path.getsize(path) - size, 0))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
