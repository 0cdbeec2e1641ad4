"""The body of a trial worker: hosts one trial at a time in a long-lived process.

``executors/ray/executor.py`` turns this class into a named, detached, threaded Ray actor;
nothing here imports Ray, so it is tested in-process.  One process may host many
trials in turn (actor reuse): a finished trial's results stay until the executor
``release``s it or assigns the next trial, so an operator that restarts between the
two can still fetch them.

A process that still runs threads a finished trial left behind hosts no other
trial: ``stop`` and ``release`` answer ``retire`` (the executor kills it instead of
pooling it) and ``assign`` refuses.  Such a thread cannot report into the next
trial anyway (api.py scopes sessions), but it may hold memory, a GPU or a port.

A host nobody talks to ends itself (``on_idle``): after ``idle_timeout_s`` with no
trial, or ``orphan_timeout_s`` holding a finished trial nobody fetched (its
operator is gone for good).  A running trial is ended only by its lease: with
``lease_timeout_s``, when its controller has not called for that long (the operator
and its Experiment are gone, e.g. deleted while no operator ran), the trial stops and
the host ends, so a detached actor never keeps its GPUs forever.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

from kubetune.trainable import api, output
from kubetune.trainable.function_runner import RUNNING, FunctionRunner

UNKNOWN = "unknown"   # this host does not hold the trial asked about
# how long a finished trial's threads get to end before its process is retired: a thread
# that ends right after the function (a logger flushing, a joined helper) is no reason
STRAY_GRACE_S = 1.0


class TrialHost:
    def __init__(self, name: str, pool_key: str = "", *, info: dict | None = None,
                 idle_timeout_s: float = 60.0, orphan_timeout_s: float = 600.0,
                 capture_output: bool = True, on_idle: Callable[[], None] | None = None,
                 lease_timeout_s: float = 0.0):
        self.name = name
        self.pool_key = pool_key
        self._info = dict(info or {})
        self._runner: FunctionRunner | None = None
        self._released = True
        self._lock = threading.Lock()
        self._last_call = time.monotonic()
        self._fetching = 0      # long polls in progress: the controller is there
        self._lease_timeout_s = lease_timeout_s
        self._hosted = 0
        if capture_output:
            # A worker process of its own: prints of a thread without a trial go to the current one.
            output.install(self._current_output)
        if on_idle is not None:
            self._idle_timeout_s = idle_timeout_s
            self._orphan_timeout_s = orphan_timeout_s
            threading.Thread(target=self._watch_idle, args=(on_idle,), daemon=True,
                             name="kubetune-idle-watch").start()

    # ---------------------------------------------------------------- calls from the executor

    def assign(self, launch: dict[str, Any]) -> dict:
        """Start a trial (a LaunchRequest as a dict).  Idempotent for the same attempt."""
        self._touch()
        with self._lock:
            current = self._runner
            if (current is not None and current.trial_key == launch["trial_key"]
                    and current.attempt == launch["attempt"]):
                return self._describe_locked(attached=True)
            if current is not None and current.state == RUNNING:
                return self._describe_locked(refused=f"busy with {current.trial_key}")
            strays = current.stray_threads() if current is not None else []
            if strays:
                return self._describe_locked(
                    refused=f"threads left by trial {current.trial_key} still run ({', '.join(strays[:5])}); "
                            "this worker is retired")
            runner = FunctionRunner(
                launch["entrypoint"], trial_key=launch["trial_key"], config=launch["config"],
                attempt=launch["attempt"], start_iteration=launch["start_iteration"],
                start_seq=launch["start_seq"], checkpoint=launch["checkpoint"],
                storage=launch["storage"], keep_last=launch["keep_last"],
                keep_best=launch.get("keep_best", 0), metric=launch.get("metric"),
                mode=launch.get("mode") or "min")
            self._runner, self._released = runner, False
            self._hosted += 1
            runner.start()
            return self._describe_locked()

    def fetch(self, trial_key: str, after_seq: int, limit: int = 1000,
              wait_s: float = 0.0) -> dict:
        self._touch()
        runner = self._runner_for(trial_key)
        if runner is None:
            return {"trial_key": trial_key, "state": UNKNOWN, "results": [], "error": ""}
        self._fetching += 1
        try:
            batch = runner.fetch(after_seq, limit, wait_s)
        finally:
            self._fetching -= 1
            self._touch()
        return batch

    def stop(self, trial_key: str, timeout_s: float = 5.0, after_seq: int | None = None,
             at_checkpoint: bool = False) -> dict:
        """Ask the trial to stop (or pause at its next checkpoint) and wait for it.

        Returns the final batch (results after ``after_seq`` when given) plus
        ``ended``: False if the function did not reach a report in time, in which
        case the caller must kill this process to end it.
        """
        self._touch()
        runner = self._runner_for(trial_key)
        if runner is None:
            return {"trial_key": trial_key, "state": UNKNOWN, "results": [], "error": "",
                    "ended": True}
        runner.request_stop(at_checkpoint=at_checkpoint)
        started = time.monotonic()
        ended = runner.join(timeout_s)
        batch = runner.fetch(after_seq if after_seq is not None else runner.last_seq)
        batch["ended"] = ended
        if ended:
            grace = min(STRAY_GRACE_S, max(timeout_s - (time.monotonic() - started), 0.0))
            batch["retire"] = TrialHost.release(self, trial_key, grace_s=grace)["retire"]
        return batch

    def release(self, trial_key: str, grace_s: float = STRAY_GRACE_S) -> dict:
        """Forget a finished trial: this host is free for the next one, unless threads the
        trial started still run after ``grace_s``: ``retire`` names them."""
        self._touch()
        with self._lock:
            runner = self._runner
            if runner is None or runner.trial_key != trial_key or runner.state == RUNNING:
                return {"retire": []}
            self._released = True
        runner.trim_checkpoints()
        return {"retire": _wait_for_strays(runner, grace_s)}

    def describe(self) -> dict:
        self._touch()
        with self._lock:
            return self._describe_locked()

    def logs(self, trial_key: str, lines: int = 200) -> str | None:
        self._touch()
        runner = self._runner_for(trial_key)
        return None if runner is None else runner.output.tail(lines)

    # ---------------------------------------------------------------- internals

    def _runner_for(self, trial_key: str) -> FunctionRunner | None:
        runner = self._runner
        return runner if runner is not None and runner.trial_key == trial_key else None

    def _describe_locked(self, attached: bool = False, refused: str = "") -> dict:
        runner = self._runner
        held = runner is not None and not self._released
        return {**self._info, "name": self.name, "pool_key": self.pool_key, "pid": os.getpid(),
                "trial_key": runner.trial_key if held else None,
                "attempt": runner.attempt if held else None,
                "state": runner.state if held else None,
                "last_seq": runner.last_seq if held else None,
                "hosted": self._hosted, "attached": attached, "refused": refused,
                "stray_threads": len(runner.stray_threads()) if runner is not None else 0}

    def _current_output(self):
        # a thread's output goes where its reports go: a stray thread's to its own trial
        session = api.current_session()
        runner = session if isinstance(session, FunctionRunner) else self._runner
        return runner.output if runner is not None else None

    def _touch(self) -> None:
        self._last_call = time.monotonic()

    def _lease_expired(self) -> bool:
        """No call from the controller (none in progress) for ``lease_timeout_s``."""
        return (self._lease_timeout_s > 0 and not self._fetching
                and time.monotonic() - self._last_call > self._lease_timeout_s)

    def _watch_idle(self, on_idle: Callable[[], None]) -> None:
        tick = threading.Event()
        while not tick.wait(min(1.0, self._idle_timeout_s / 4)):
            with self._lock:
                runner = self._runner
                if runner is not None and runner.state == RUNNING:
                    if not self._lease_expired():
                        continue
                    # its controller is gone: end the trial (its checkpoints stay) and the host
                    runner.request_stop()
                    runner.join(5.0)
                    on_idle()
                    return
                holding = runner is not None and not self._released
                limit = self._orphan_timeout_s if holding else self._idle_timeout_s
                idle_for = time.monotonic() - self._last_call
                if runner is not None and runner.ended_at is not None:
                    idle_for = min(idle_for, time.time() - runner.ended_at)
                if idle_for > limit:
                    on_idle()
                    return


def _wait_for_strays(runner: FunctionRunner, grace_s: float) -> list[str]:
    deadline = time.monotonic() + grace_s
    strays = runner.stray_threads()
    while strays and time.monotonic() < deadline:
        time.sleep(0.05)       # threads offer no "wait for any of these"; short and bounded
        strays = runner.stray_threads()
    return strays
