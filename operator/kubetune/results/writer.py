"""ResultsWriter: the operator's one writer thread to the results store.

The controller hands it rows and goes on (``submit`` never blocks and does no I/O):
a slow or unreachable database must not hold up the control loop.  The thread
writes what is pending in batches — at 30,000 results per trial, one transaction
per result would be the bottleneck — and on failure keeps the rows and retries
with backoff.  What is pending is bounded: experiment and trial rows are coalesced
per UID (the newest wins), and beyond ``max_pending_results`` the OLDEST results
are dropped and counted, so an outage of any length costs bounded memory and says
how much was lost (``problem``/``dropped``, shown on the Experiment)."""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, TypeVar

from kubetune.results.rows import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow
from kubetune.results.store import ResultsStore

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PENDING_RESULTS = 200_000      # about 5 metrics each: some 200 MB of Python objects at most
MAX_BATCH_RESULTS = 20_000         # one transaction; SQLite writes ~15k results/s on 2 cores
RETRY_SECONDS = (0.5, 1, 2, 5, 10, 30)
MAX_PROBLEM_CHARS = 500


class ResultsWriter:
    def __init__(self, open_store: Callable[[], ResultsStore], *,
                 max_pending_results: int = MAX_PENDING_RESULTS) -> None:
        self._open_store = open_store
        self._max_pending = max_pending_results
        self._lock = threading.Condition()
        self._open_lock = threading.Lock()   # the writer thread and readers open the store once
        self._experiments: dict[str, ExperimentRow] = {}
        self._trials: dict[str, TrialRow] = {}
        self._failures: dict[tuple[str, int], FailureRow] = {}
        self._results: collections.deque[ResultRow] = collections.deque()
        self._writing = 0                  # rows taken by the thread, not yet written
        self._closed = False
        self.store: ResultsStore | None = None
        self.problem: str | None = None    # the last write error while writes fail
        self.dropped = 0                   # results given up (buffer full during an outage)
        self.written = 0                   # results written
        self._thread = threading.Thread(target=self._run, name="kubetune-results-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the controller's side

    def submit(self, batch: Batch) -> None:
        with self._lock:
            self._merge(batch, newer=True)
            overflow = len(self._results) - self._max_pending
            if overflow > 0:
                for _ in range(overflow):
                    self._results.popleft()
                self.dropped += overflow
            self._lock.notify()

    def read(self, query: Callable[[ResultsStore], T]) -> T:
        """Run ``query`` on the store (blocking: call it from a thread).  Rows still
        pending here are not in its answer."""
        return query(self._opened())

    def _opened(self) -> ResultsStore:
        with self._open_lock:
            if self.store is None:
                self.store = self._open_store()
            return self.store

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._results) + len(self._experiments) + len(self._trials) + len(self._failures) \
                + self._writing

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far is written (True) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._has_pending() or self._writing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.5))
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending (up to ``timeout``), then stop the thread."""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout)
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ the thread

    def _has_pending(self) -> bool:
        return bool(self._results or self._experiments or self._trials or self._failures)

    def _merge(self, batch: Batch, *, newer: bool) -> None:
        """Add rows; ``newer=False`` puts back a failed batch behind what came since."""
        for table, rows, key in ((self._experiments, batch.experiments, lambda r: r.uid),
                                 (self._trials, batch.trials, lambda r: r.uid),
                                 (self._failures, batch.failures, lambda r: (r.trial_uid, r.attempt))):
            for row in rows:
                if newer:
                    table[key(row)] = row
                else:
                    table.setdefault(key(row), row)
        if newer:
            self._results.extend(batch.results)
        else:
            self._results.extendleft(reversed(batch.results))

    def _take(self) -> Batch:
        batch = Batch(list(self._experiments.values()), list(self._trials.values()),
                      [self._results.popleft() for _ in range(min(len(self._results), MAX_BATCH_RESULTS))],
                      list(self._failures.values()))
        self._experiments.clear(), self._trials.clear(), self._failures.clear()
        self._writing = len(batch)
        return batch

    def _run(self) -> None:
        failures = 0
        while True:
            with self._lock:
                while not self._has_pending() and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                batch = self._take()
            try:
                self._opened().write(batch)
            except Exception as error:  # noqa: BLE001 - any database trouble: keep the rows, retry
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                with self._lock:
                    self._writing = 0
                    self._merge(batch, newer=False)
                    self.problem = f"{type(error).__name__}: {error}"[:MAX_PROBLEM_CHARS]
                    log.warning("results store: write of %d rows failed (retry in %ss): %s",
                                len(batch), delay, self.problem)
                    self._lock.wait(delay)   # close() cuts the wait short
                continue
            failures = 0
            with self._lock:
                self._writing = 0
                self.written += len(batch.results)
                self.problem = None
                self._lock.notify_all()
