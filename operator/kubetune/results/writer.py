"""ResultsWriter: the operator's one writer thread to the results store.

The controller hands it rows and goes on (``submit`` never blocks and does no I/O):
a slow or unreachable database must not hold up the control loop.  The thread
writes what is pending in batches — at 30,000 results per trial, one transaction
per result would be the bottleneck.

Every tenant shares this thread, so nothing one tenant reports may stop it:
- a batch the database refuses for its content (not an outage) is halved until the
  refused rows stand alone; the rest is written at once.  A row refused alone is
  tried ``ROW_ATTEMPTS`` times, then set aside: counted against ITS Experiment
  (``rejection``, shown there as ResultsRejected) and logged, never retried again;
- an outage (the server away, the disk full) keeps everything and retries with
  backoff; what is pending is bounded in estimated BYTES (``max_pending_bytes``):
  experiment and trial rows are coalesced per UID, and beyond the bound the OLDEST
  results are dropped and counted (``dropped``).  ``high_water_bytes`` is the most
  ever pending (a Prometheus gauge, metrics.py);
- the details of a failed write (SQL text, bound values: other tenants' rows) go to
  the operator log only; ``problem_kind`` (an exception class) is what Experiments show.

``forget_experiment`` drops what is pending for a deleted Experiment and removes what
the store holds of it; ``retention_s`` removes finished Experiments that old."""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, TypeVar

from kubetune.results.isolation import (Rejection, batch_of, describe, halves, is_outage, only_row, owner,
                                        row_bytes, set_aside)
from kubetune.results.retention import Retention
from kubetune.results.rows import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow, UsageRow
from kubetune.results.store import ResultsStore

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_PENDING_BYTES = 256 * 2 ** 20   # estimated (isolation.row_bytes); with one batch in flight on top
MAX_BATCH_RESULTS = 20_000          # one transaction; SQLite writes ~15k results/s on 2 cores
MAX_BATCH_BYTES = 16 * 2 ** 20
RETRY_SECONDS = (0.5, 1, 2, 5, 10, 30)
ROW_ATTEMPTS = 3                    # a row refused alone: tried this often, then set aside
MAX_PROBLEM_CHARS = 500
MAX_FORGOTTEN = 100_000             # UIDs of deleted Experiments and their trials, remembered


class ResultsWriter:
    def __init__(self, open_store: Callable[[], ResultsStore], *, max_pending_bytes: int = MAX_PENDING_BYTES,
                 retention_s: float = 0.0, clock: Callable[[], float] = time.time) -> None:
        self._open_store = open_store
        self._max_bytes = max_pending_bytes
        self._retention = Retention(retention_s, clock)   # finished Experiments' rows (retention.py)
        self._lock = threading.Condition()
        self._open_lock = threading.Lock()   # the writer thread and readers open the store once
        self._experiments: dict[str, ExperimentRow] = {}
        self._trials: dict[str, TrialRow] = {}
        self._failures: dict[tuple[str, int], FailureRow] = {}
        self._usage: dict[tuple[str, int], UsageRow] = {}     # per attempt: the latest figures win
        self._results: collections.deque[tuple[ResultRow, int]] = collections.deque()   # (row, its bytes)
        self._bytes = 0                    # of the above
        self._writing = self._writing_bytes = 0   # rows (bytes) taken by the thread, not yet written
        self._suspects: list[tuple[Batch, int, float]] = []   # (one row, failed attempts, retry after)
        self._retrying = 0   # suspects taken out to write again, not yet settled: pending (flush waits)
        self._owners: dict[str, str] = {}   # trial UID -> its Experiment's UID
        self._forgotten: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._to_delete: set[str] = set()   # Experiments whose stored rows are to go
        self._closed = False
        self.store: ResultsStore | None = None
        self.problem: str | None = None       # the last write error while the store is away (log only)
        self.problem_kind: str | None = None  # its exception class: safe to show to any tenant
        self.rejected: dict[str, Rejection] = {}   # Experiment UID -> its rows set aside
        self.dropped = 0                   # results (and failure records) given up: the bound, or closed
        self.written = 0                   # results written
        self.high_water_bytes = 0
        self._thread = threading.Thread(target=self._run, name="kubetune-results-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the controller's side

    def submit(self, batch: Batch) -> None:
        with self._lock:
            if self._closed:      # nothing will write it: given up at once, as at close
                self.dropped += self._counted_lost(self._rows(batch))
                return
            if self._forgotten:   # a last cycle's rows of a deleted Experiment
                batch = batch_of(row for row in self._rows(batch) if not self._is_forgotten(row))
            for trial in batch.trials:
                self._owners[trial.uid] = trial.experiment_uid
            self._merge(batch, newer=True)
            self._bound()
            self._lock.notify()

    def forget_experiment(self, uid: str) -> None:
        """The Experiment is deleted: drop its pending rows, remove its stored ones (soon,
        from the thread) and ignore anything still submitted for it."""
        with self._lock:
            if self._closed:
                return
            trials = {t for t, e in self._owners.items() if e == uid}
            for key in (uid, *trials):
                self._forgotten[key] = None
            while len(self._forgotten) > MAX_FORGOTTEN:
                self._forgotten.popitem(last=False)
            for trial in trials:
                del self._owners[trial]
            kept = batch_of(row for row in self._rows(self._pending_batch()) if not self._is_forgotten(row))
            self._clear_pending()
            self._merge(kept, newer=True)
            self._suspects = [s for s in self._suspects if not self._is_forgotten(only_row(s[0]))]
            self.rejected.pop(uid, None)
            self._to_delete.add(uid)
            self._lock.notify()

    def rejection(self, experiment_uid: str) -> Rejection | None:
        with self._lock:
            return self.rejected.get(experiment_uid)

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
            return (len(self._results) + len(self._experiments) + len(self._trials) + len(self._failures)
                    + len(self._usage) + self._writing + len(self._suspects) + self._retrying)

    @property
    def pending_bytes(self) -> int:
        with self._lock:
            return self._bytes + self._writing_bytes

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything submitted so far is written or set aside (True), or
        ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._has_pending() or self._writing or self._suspects or self._retrying or self._to_delete:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():   # (it died: nothing will change)
                    return False
                self._lock.wait(min(remaining, 0.5))
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending (up to ``timeout``), then stop the thread: what it has not written
        is given up (``_give_up``) when its round under way ends.  Closing again does nothing."""
        with self._lock:
            if self._closed:
                return
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout)
        with self._lock:
            if not self._thread.is_alive():
                self._give_up()      # again (a no-op) or first: the thread died of an error
            else:                    # what that write leaves is given up when it returns
                log.warning("results writer: a write has not returned %ss after close; %d row(s) not "
                            "written yet", timeout, self.pending)
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ the buffer (under the lock)

    @staticmethod
    def _rows(batch: Batch):
        return [*batch.experiments, *batch.trials, *batch.results, *batch.failures, *batch.usage]

    def _is_forgotten(self, row) -> bool:
        key = owner(row, self._owners)
        return key in self._forgotten or getattr(row, "trial_uid", None) in self._forgotten

    def _has_pending(self) -> bool:
        return bool(self._results or self._experiments or self._trials or self._failures or self._usage)

    def _pending_batch(self) -> Batch:
        return Batch(list(self._experiments.values()), list(self._trials.values()), [r for r, _ in self._results],
                     list(self._failures.values()), list(self._usage.values()))

    def _clear_pending(self) -> None:
        self._experiments.clear(), self._trials.clear(), self._failures.clear(), self._results.clear()
        self._usage.clear()
        self._bytes = 0

    def _merge(self, batch: Batch, *, newer: bool) -> None:
        """Add rows; ``newer=False`` puts back a batch behind what came since."""
        for table, rows, key in ((self._experiments, batch.experiments, lambda r: r.uid),
                                 (self._trials, batch.trials, lambda r: r.uid),
                                 (self._failures, batch.failures, lambda r: (r.trial_uid, r.attempt)),
                                 (self._usage, batch.usage, lambda r: (r.trial_uid, r.attempt))):
            for row in rows:
                old = table.get(key(row))
                if old is not None and not newer:
                    continue
                if old is not None:
                    self._bytes -= row_bytes(old)
                table[key(row)] = row
                self._bytes += row_bytes(row)
        sized = [(row, row_bytes(row)) for row in batch.results]
        self._bytes += sum(size for _, size in sized)
        if newer:
            self._results.extend(sized)
        else:
            self._results.extendleft(reversed(sized))

    def _bound(self) -> None:
        """Past the byte bound (what waits and what is being written), the oldest results go
        first, then the oldest failure records."""
        while self._bytes + self._writing_bytes > self._max_bytes and self._results:
            self._bytes -= self._results.popleft()[1]
            self.dropped += 1
        while self._bytes + self._writing_bytes > self._max_bytes and self._failures:
            self._bytes -= row_bytes(self._failures.pop(next(iter(self._failures))))
            self.dropped += 1
        self.high_water_bytes = max(self.high_water_bytes, self._bytes + self._writing_bytes)

    def _take(self) -> Batch:
        results, size = [], 0
        limit = min(MAX_BATCH_BYTES, self._max_bytes // 4)
        while self._results and len(results) < MAX_BATCH_RESULTS and (size < limit or not results):
            row, row_size = self._results.popleft()
            results.append(row)
            size += row_size
        batch = Batch(list(self._experiments.values()), list(self._trials.values()), results,
                      list(self._failures.values()), list(self._usage.values()))
        size += sum(row_bytes(row) for row in (*batch.experiments, *batch.trials, *batch.failures, *batch.usage))
        self._experiments.clear(), self._trials.clear(), self._failures.clear(), self._usage.clear()
        self._bytes -= size
        self._writing, self._writing_bytes = len(batch), size
        return batch

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        failures = 0
        while True:
            with self._lock:
                while not self._work_due() and not self._closed:
                    self._lock.wait(self._idle_wait())
                if self._closed:
                    self._give_up()
                    return
                batch = self._take() if self._has_pending() else Batch()
                suspects, self._suspects = self._due_suspects()
                self._retrying = len(suspects)
                deletions = set(self._to_delete)
            try:
                store = self._opened()
            except Exception as error:  # noqa: BLE001 - opening failed: the store is away
                outage: Exception | None = error
                with self._lock:
                    self._merge(batch, newer=False)
                    self._suspects += suspects
                    self._retrying = 0
            else:
                outage = self._write_isolating(store, batch)
                if outage is None:
                    outage = self._retry_suspects(store, suspects)
                else:
                    with self._lock:
                        self._suspects += suspects
                        self._retrying = 0
                if outage is None:
                    outage = self._remove_old(store, deletions)
            with self._lock:
                self._writing = self._writing_bytes = 0
                if outage is None:
                    failures = 0
                    self.problem = self.problem_kind = None
                    self._lock.notify_all()
                    continue
                delay = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                self._bound()
                self.problem = f"{type(outage).__name__}: {outage}"[:MAX_PROBLEM_CHARS]
                self.problem_kind = type(outage).__name__
                log.warning("results store: write failed (retry in %ss): %s", delay, self.problem)
                self._lock.wait_for(lambda: self._closed, delay)   # close() cuts the wait short

    def _give_up(self) -> None:
        """Closed (under the lock): what is not written now never will be; counted as the bound counts."""
        left = [*self._rows(self._pending_batch()), *(only_row(single) for single, _, _ in self._suspects)]
        lost = self._counted_lost(left)
        states = sum(not isinstance(row, (ResultRow, FailureRow)) for row in left)
        self._clear_pending()
        self._suspects, self._to_delete = [], set()
        self.dropped += lost
        if lost or states:
            log.warning("results writer closed with %d result(s) or failure record(s) and %d state row(s) "
                        "not written (%s)", lost, states, self.problem or "the store was slow")

    def _counted_lost(self, rows) -> int:
        """How many of ``rows`` count in ``dropped``: results and failure records not forgotten."""
        return sum(isinstance(row, (ResultRow, FailureRow)) and not self._is_forgotten(row) for row in rows)

    def _work_due(self) -> bool:
        now = time.monotonic()
        return self._has_pending() or bool(self._to_delete) or any(due <= now for _, _, due in self._suspects) \
            or self._retention.is_due()

    def _idle_wait(self) -> float | None:
        waits = [due - time.monotonic() for _, _, due in self._suspects]
        if (due := self._retention.due_in()) is not None:
            waits.append(due)
        return max(0.05, min(waits)) if waits else None

    def _due_suspects(self) -> tuple[list[tuple[Batch, int, float]], list[tuple[Batch, int, float]]]:
        now = time.monotonic()
        return [s for s in self._suspects if s[2] <= now], [s for s in self._suspects if s[2] > now]

    def _write_isolating(self, store: ResultsStore, batch: Batch) -> Exception | None:
        """Write ``batch``, halving any part the store refuses until the refused rows stand
        alone (they become suspects).  An outage puts back what is not written yet."""
        todo = [batch] if len(batch) else []
        while todo:
            part = todo.pop()
            try:
                store.write(part)
            except Exception as error:  # noqa: BLE001 - any refusal: isolate it, never retry it whole forever
                if is_outage(error):
                    with self._lock:
                        for left in (part, *reversed(todo)):
                            self._merge(left, newer=False)
                        self._writing = self._writing_bytes = 0
                    return error
                if len(part) == 1:
                    self._refused(part, 1, error)
                else:
                    first, second = halves(part)
                    todo += [second, first]
                continue
            with self._lock:
                self.written += len(part.results)
        return None

    def _retry_suspects(self, store: ResultsStore, suspects: list[tuple[Batch, int, float]]) -> Exception | None:
        for index, (row, attempts, _) in enumerate(suspects):
            try:
                store.write(row)
            except Exception as error:  # noqa: BLE001
                if is_outage(error):
                    with self._lock:
                        self._suspects += suspects[index:]
                        self._retrying = 0
                    return error
                self._refused(row, attempts + 1, error, retried=True)
                continue
            with self._lock:
                self._retrying -= 1
                self.written += len(row.results)
        return None

    def _refused(self, single: Batch, attempts: int, error: Exception, *, retried: bool = False) -> None:
        """A row the store refused alone: a suspect again, or set aside.  ``retried``: it
        was one of the suspects being retried (``_retrying``), settled here under the lock."""
        row = only_row(single)
        with self._lock:
            if retried:
                self._retrying -= 1
            if self._is_forgotten(row):   # its Experiment was deleted while the row was retried
                return
            key = owner(row, self._owners)
            if attempts < ROW_ATTEMPTS:
                due = time.monotonic() + RETRY_SECONDS[min(attempts - 1, len(RETRY_SECONDS) - 1)]
                self._suspects.append((single, attempts, due))
                return
            kind = type(error).__name__
            set_aside(self.rejected, key, row, kind)
        log.warning("results store: set aside a %s of experiment %s after %d refusals: %s",
                    describe(row), key or "?", attempts, f"{kind}: {error}"[:MAX_PROBLEM_CHARS])

    def _remove_old(self, store: ResultsStore, deletions: set[str]) -> Exception | None:
        """Remove what the store holds of deleted Experiments, and (``retention_s``) of
        finished ones that old."""
        try:
            for uid in deletions:
                removed = store.delete_experiment(uid)
                log.info("results store: removed experiment %s (%d results)", uid, removed)
                with self._lock:
                    self._to_delete.discard(uid)
            self._retention.run_if_due(store)
        except Exception as error:  # noqa: BLE001
            if is_outage(error):
                return error
            log.warning("results store: removing old results failed: %s", f"{error}"[:MAX_PROBLEM_CHARS])
            with self._lock:
                self._to_delete -= deletions
            self._retention.skip()
        return None
