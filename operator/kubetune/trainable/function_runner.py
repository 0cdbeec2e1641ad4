"""Run a user's training function in a thread and buffer what it reports.

This is Ray Tune's FunctionRunner with one deliberate difference: ``report()`` does
not block until the tuner asks for the next result.  Each report is numbered
(``seq``, monotonic over the trial's whole life, across retries) and appended to an
in-memory buffer; the operator fetches "everything after seq N" in batches, which is
idempotent, so nothing is lost or counted twice, and the function never waits for a
round trip to the operator.  What is given up: the tuner cannot act *between* two
reports of a fast function (it sees them in a batch); a stop or pause therefore
takes effect at the function's next report after the request, not at the very
report that triggered the decision.  Results reported after a stop decision are
still buffered; the executor hides them unless asked (``stop(after_seq=...)``).

Memory is bounded whatever the function reports: a result whose metrics exceed
``MAX_RESULT_BYTES`` of JSON is refused (report() raises), results the operator
fetched past are dropped but for a short tail (``KEPT_ACKED_RESULTS``, for an
operator that restarts before it recorded them), and a function more than
``MAX_PENDING_RESULTS`` results ahead of the operator waits in report() until it
catches up (or the trial is stopped), as the pod ingest's full buffer makes a
trial pod wait.

A report from a thread the function left running after it returned reaches this
(ended) session only (see api.py); it is dropped with a warning, and the threads
still alive are named by ``stray_threads()`` so the host does not reuse its process.

States: running -> completed (function returned) | failed (it raised; the error is
delivered after every result reported before it) | stopped (it was told to stop and
its next report ended it).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from kubetune.spec.results import MAX_RESULT_BYTES, Result, check_metric, check_metrics
from kubetune.trainable import api, raytune
from kubetune.checkpoints.storage import CheckpointStore, materialize
from kubetune.trainable.entrypoint import (describe, format_error, no_results_error, resolve_entrypoint,
                                           takes_arguments)
from kubetune.trainable.output import LineBuffer

RUNNING, COMPLETED, FAILED, STOPPED = "running", "completed", "failed", "stopped"
TERMINAL = (COMPLETED, FAILED, STOPPED)
# A long-polling fetch woken by a report lingers this long for more: a function that
# ends right after its last report then delivers its ending in the same batch, which
# saves the operator a round trip per trial (and batches fast reporters)
FETCH_LINGER_S = 0.005
# a trial's own process holds more results ahead of the operator than the operator's
# pod inbox does per trial (executors/pods/ingest.py: 1,000), which holds every trial's
MAX_PENDING_RESULTS = 10_000
KEPT_ACKED_RESULTS = 1_000          # fetched-past results kept for a restarting operator
KEPT_ACKED_BYTES = 8 << 20
# one fetch answer holds at most this many bytes of metrics (and at least one result): the
# operator reads an answer whole (executors/ray/answers.py bounds it)
FETCH_BATCH_BYTES = 8 << 20
PENDING_WAIT_S = 1.0                # a waiting report() re-checks for a stop this often
log = logging.getLogger(__name__)


def _plain(value: Any, key: str) -> Any:
    """Numpy and torch scalars as Python numbers; the result is checked as every
    collector checks it (spec/results.py): numbers or strings, NaN and Infinity included."""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (bool, int, float, str)):
        try:
            value = item()
        except (TypeError, ValueError):
            pass
    return check_metric(key, value)


class FunctionRunner:
    """One attempt of one trial: the user's function in a thread, its results buffered."""

    def __init__(self, function: Callable[..., Any] | str, *, trial_key: str,
                 config: Mapping[str, Any], attempt: int = 0, start_iteration: int = 0,
                 start_seq: int = 0, checkpoint: str | None = None,
                 storage: str | None = None, keep_last: int = 2, keep_best: int = 0,
                 metric: str | None = None, mode: str = "min", log_lines: int = 1000):
        self.function = function
        self.trial_key = trial_key
        self.config = dict(config)
        self.attempt = attempt
        self.start_iteration = start_iteration
        self.start_seq = start_seq
        self.launch_checkpoint = checkpoint
        self.output = LineBuffer(log_lines)
        self._store_args = (storage, dict(keep_last=keep_last, keep_best=keep_best,
                                          metric=metric, mode=mode))
        self._store: CheckpointStore | None = None
        self._restored: str | None = None
        self._restore_error: Exception | None = None
        # Checkpoints the operator knows of (or will, from a batch it fetched): it may resume
        # from them or hand them to another trial (PBT), so retention keeps them: the latest
        # among the results it fetched past (``after_seq``), and all fetched after those.
        self._acked = 0                     # results the operator fetched past (count)
        self._delivered = 0                 # results it was handed (count)
        self._acked_checkpoint = checkpoint
        # results[i] is result number base + i of this attempt (seq start_seq + base + i + 1);
        # the ones before ``base`` were fetched past and dropped
        self._results: list[dict] = []
        self._sizes: list[int] = []          # JSON bytes of each kept result
        self._base = 0
        self._closed = False                 # the function returned: later reports are strays'
        self._dropped_late = 0
        self._threads: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
        self._iteration = start_iteration
        self._latest_checkpoint = checkpoint
        self._state = RUNNING
        self._error = ""
        self._stop_requested = False
        self._pause_requested = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.started_at = time.time()
        self.ended_at: float | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.launch_checkpoint is not None and f"/{self.trial_key}/" not in self.launch_checkpoint:
            # Another trial's checkpoint (a PBT exploit): copy it before this returns, while
            # that trial's retention still keeps it (the executor waits for this start).
            try:
                self._restored = materialize(self.launch_checkpoint)
            except Exception as exc:  # noqa: BLE001 - the trial fails with it, in get_checkpoint
                self._restore_error = exc
        self._thread = threading.Thread(target=self._run, name=f"trial:{self.trial_key}",
                                        daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the function to end; True if it did."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def request_stop(self, at_checkpoint: bool = False) -> None:
        """Make the function's next report end it.

        With ``at_checkpoint`` (a pause), only a report that carries a checkpoint
        ends it, after that checkpoint is persisted; ``get_context().should_checkpoint``
        tells the function to produce one.
        """
        with self._changed:
            if at_checkpoint and not self._stop_requested:
                self._pause_requested = True
            else:
                self._stop_requested = True
                self._pause_requested = False
            self._changed.notify_all()      # a report waiting for room ends at once

    @property
    def state(self) -> str:
        return self._state

    @property
    def error(self) -> str:
        return self._error

    @property
    def last_seq(self) -> int:
        return self.start_seq + self._base + len(self._results)

    def adopt_thread(self, thread: threading.Thread) -> None:
        """A thread started by the function (or by its threads): api.py tells us."""
        self._threads.add(thread)

    def stray_threads(self) -> list[str]:
        """Names of the threads the function started that outlive it."""
        return sorted(t.name for t in list(self._threads) if t.is_alive())

    def _run(self) -> None:
        api.bind(self)
        outcome, error = COMPLETED, ""
        try:
            function = self.function
            raytune.serve_ray_api()          # before the trial's code imports Ray Tune
            if isinstance(function, str):
                function = resolve_entrypoint(function)
            function = raytune.adapt(function)
            try:
                if takes_arguments(function):
                    function(self.config)
                else:
                    function()
            except api.TrialDone:
                pass
            if self.last_seq == self.start_seq and self.start_iteration == 0:
                # a resumed attempt may rightly find nothing left to do; a first one may not
                outcome, error = FAILED, no_results_error(describe(self.function))
        except api.TrialStopped:
            outcome = STOPPED
        except BaseException as exc:  # noqa: BLE001 - the trial fails, the worker lives on
            outcome, error = FAILED, format_error(exc, skip_frames=1)
        finally:
            with self._changed:
                self._closed = True
            api.unbind(self)
            if self._restored is not None:
                shutil.rmtree(os.path.dirname(self._restored), ignore_errors=True)
        with self._changed:
            self._state, self._error = outcome, error
            self.ended_at = time.time()
            self._changed.notify_all()

    # ---------------------------------------------------------------- session (api.py)

    def report(self, metrics: Mapping[str, Any], checkpoint: str | os.PathLike | None) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"kubetune.report() takes a dict of metrics, got {type(metrics).__name__}")
        clean = check_metrics({str(k): _plain(v, str(k)) for k, v in metrics.items()})
        if self._closed:
            self._drop_late_report()
            return
        size = len(json.dumps(clean, default=str))
        if size > MAX_RESULT_BYTES:
            raise ValueError(f"kubetune.report(): the metrics are {size} bytes of JSON, more than the "
                             f"{MAX_RESULT_BYTES} allowed per result; report numbers, and save large "
                             "data in the checkpoint")
        self._wait_for_room()
        iteration = self._iteration + 1
        location = None
        if checkpoint is not None:
            location = self._checkpoint_store().persist(checkpoint, iteration, clean,
                                                        also_keep=self._known_checkpoints())
        result = Result(seq=self.last_seq + 1, iteration=iteration, metrics=clean, timestamp=time.time(),
                        checkpoint=location).to_wire()
        with self._changed:
            self._iteration = iteration
            if location is not None:
                self._latest_checkpoint = location
            self._results.append(result)
            self._sizes.append(size)
            self._changed.notify_all()
            stop = self._stop_requested or (self._pause_requested and location is not None)
        if stop:
            raise api.TrialStopped()

    def _drop_late_report(self) -> None:
        with self._changed:
            self._dropped_late += 1
            first = self._dropped_late == 1
        if first:   # once per attempt: a stray thread may report in a loop
            log.warning("kubetune.report() from thread %r after trial %s (attempt %d) ended: "
                        "dropped, as are its later reports; end the threads your function "
                        "starts before it returns", threading.current_thread().name,
                        self.trial_key, self.attempt)

    def _wait_for_room(self) -> None:
        """Back-pressure: wait while the operator is ``MAX_PENDING_RESULTS`` behind (a stop
        ends the wait: this result is then the last, and report() raises after it)."""
        with self._changed:
            while (self.last_seq - self.start_seq - self._acked >= MAX_PENDING_RESULTS
                   and not self._stop_requested):
                self._changed.wait(PENDING_WAIT_S)

    def _forget_acked(self) -> None:
        """Drop fetched-past results beyond the kept tail (call with ``_changed`` held)."""
        acked_kept = self._acked - self._base
        drop = max(acked_kept - KEPT_ACKED_RESULTS, 0)
        kept_bytes = sum(self._sizes[drop:acked_kept])
        while drop < acked_kept and kept_bytes > KEPT_ACKED_BYTES:
            kept_bytes -= self._sizes[drop]
            drop += 1
        if drop:
            del self._results[:drop]
            del self._sizes[:drop]
            self._base += drop

    def trim_checkpoints(self) -> None:
        """The attempt is over and the operator has its results: what retention kept for
        the operator's sake (``_known_checkpoints``) goes, the latest N (and best) stay."""
        try:
            if self._store is not None:
                self._store.trim()
        except Exception:  # noqa: BLE001 - storage trouble must not fail the host
            pass

    def _known_checkpoints(self) -> set[str]:
        with self._changed:
            fetched = self._results[self._acked - self._base:max(self._delivered - self._base, 0)]
            known = {r["checkpoint"] for r in fetched if r["checkpoint"]}
            return known | ({self._acked_checkpoint} if self._acked_checkpoint else set())

    def get_config(self) -> dict:
        return dict(self.config)

    def get_checkpoint(self) -> str | None:
        if self.launch_checkpoint is None:
            return None
        if self._restore_error is not None:
            raise self._restore_error
        if self._restored is None:
            self._restored = materialize(self.launch_checkpoint)
        return self._restored

    def get_context(self) -> api.TrialContext:
        return api.TrialContext(trial_key=self.trial_key, attempt=self.attempt,
                                iteration=self._iteration, start_iteration=self.start_iteration,
                                should_checkpoint=self._pause_requested,
                                should_stop=self._stop_requested)

    def _checkpoint_store(self) -> CheckpointStore:
        if self._store is None:
            storage, options = self._store_args
            self._store = CheckpointStore(storage or "", self.trial_key, **options)
        return self._store

    # ---------------------------------------------------------------- operator side

    def fetch(self, after_seq: int, limit: int = 1000, wait_s: float = 0.0) -> dict:
        """Results with seq > ``after_seq`` (at most ``limit``) and the state.

        The state is terminal only once this batch holds the last result, so the
        error of a failed function always arrives after everything it reported.
        With ``wait_s`` > 0, waits that long for something new first (and, once woken
        by a report, ``FETCH_LINGER_S`` more for the function to end).
        """
        with self._changed:
            if wait_s > 0 and self.last_seq <= after_seq and self._state == RUNNING:
                self._changed.wait_for(
                    lambda: self.last_seq > after_seq or self._state != RUNNING, wait_s)
                if self._state == RUNNING and self.last_seq > after_seq:
                    self._changed.wait_for(lambda: self._state != RUNNING, FETCH_LINGER_S)
            count = self._base + len(self._results)
            # an operator asking for results dropped already (only one far behind its own
            # cursor could) gets the oldest kept: the seqs show the gap
            start = max(after_seq - self.start_seq, self._base)
            batch = self._results[start - self._base:start - self._base + limit]
            sizes = self._sizes[start - self._base:start - self._base + len(batch)]
            total = 0
            for index, size in enumerate(sizes):
                total += size
                if total > FETCH_BATCH_BYTES and index:
                    batch = batch[:index]
                    break
            more = start + len(batch) < count
            acked = min(max(after_seq - self.start_seq, 0), count)
            if acked > self._acked:
                newly = self._results[max(self._acked - self._base, 0):acked - self._base]
                self._acked_checkpoint = next((r["checkpoint"] for r in reversed(newly)
                                               if r["checkpoint"]), self._acked_checkpoint)
                self._acked = acked
                self._forget_acked()
                self._changed.notify_all()      # a report waiting for room
            self._delivered = max(self._delivered, start + len(batch))
            state = RUNNING if more else self._state
            return {"trial_key": self.trial_key, "attempt": self.attempt, "results": batch,
                    "state": state, "error": self._error if state == FAILED else "",
                    "last_seq": self.last_seq, "iteration": self._iteration,
                    "checkpoint": self._latest_checkpoint,
                    # this host's clock: what the operator's GPU-hour ledger counts (core/usage.py)
                    "started_at": self.started_at, "ended_at": self.ended_at if state != RUNNING else None}
