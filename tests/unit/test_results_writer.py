"""A row the results store refuses is retried alone, then set aside against its own
Experiment; until then the writer counts it as pending.  The store here is a fake
that refuses one row the way PostgreSQL refuses a value past BIGINT (a DataError)."""
from __future__ import annotations

import threading

import psycopg
import pytest
from sqlalchemy import exc

from kubetune.results import Batch, ResultRow
from kubetune.results import writer as writer_module
from kubetune.results.isolation import is_outage
from kubetune.results.writer import ResultsWriter
from unit_helpers import wait_for

BAD_SEQ = 7


def wrapped(error: Exception) -> exc.DBAPIError:
    """``error`` as SQLAlchemy hands it to the writer (the class it picks by the driver's)."""
    return exc.DBAPIError.instance("INSERT INTO kubetune_results ...", {}, error, psycopg.Error)


class RefusingStore:
    """Writes every batch without the row of seq BAD_SEQ and refuses any that holds it.
    The row's first retry alone waits for ``release``: the test looks at the writer then."""

    def __init__(self) -> None:
        self.stored: list[int] = []
        self.alone = 0                       # writes of the bad row by itself
        self.retrying, self.release = threading.Event(), threading.Event()

    def write(self, batch: Batch) -> None:
        if any(row.seq == BAD_SEQ for row in batch.results):
            if len(batch) == 1:
                self.alone += 1
                if self.alone == 2:
                    self.retrying.set()
                    self.release.wait(30)
            raise wrapped(psycopg.errors.NumericValueOutOfRange("bigint out of range"))
        self.stored += [row.seq for row in batch.results]

    def delete_experiment(self, uid: str) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(writer_module, "RETRY_SECONDS", (0.01,) * 6)


def test_a_refused_row_being_retried_is_still_pending_until_it_is_set_aside(fast_retries):
    # Before: the thread took the due refused rows out of its list to retry them, and
    # while it did, flush() saw nothing pending and returned: the PostgreSQL test then
    # found the rows neither stored nor rejected (under load, where a retry is slow).
    store = RefusingStore()
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(Batch(results=[ResultRow("A/exp-0", seq, seq, {"loss": 1.0}) for seq in range(20)]))
        wait_for(store.retrying.is_set)
        assert writer.flush(timeout=0.2) is False and writer.pending == 1
        assert writer.rejection("A") is None
        store.release.set()
        assert writer.flush(timeout=30)
        rejected = writer.rejection("A")
        assert rejected is not None and rejected.rows == 1 and rejected.kinds == ("DataError",)
        assert store.alone == writer_module.ROW_ATTEMPTS
        assert sorted(store.stored) == [seq for seq in range(20) if seq != BAD_SEQ]
        assert writer.written == 19 and writer.dropped == 0 and writer.problem is None
    finally:
        store.release.set()
        writer.close(timeout=5)


def test_an_experiment_deleted_while_its_refused_row_is_retried_gets_no_rejection(fast_retries):
    store = RefusingStore()
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(Batch(results=[ResultRow("A/exp-0", seq, seq, {}) for seq in (BAD_SEQ, BAD_SEQ + 1)]))
        wait_for(store.retrying.is_set)
        writer.forget_experiment("A")
        store.release.set()
        assert writer.flush(timeout=30)
        assert writer.rejection("A") is None and writer.rejected == {} and writer.pending == 0
    finally:
        store.release.set()
        writer.close(timeout=5)


@pytest.mark.parametrize("error", [
    psycopg.errors.NumericValueOutOfRange("bigint out of range"),
    psycopg.errors.UniqueViolation("duplicate key"),
    psycopg.errors.InFailedSqlTransaction("current transaction is aborted"),
], ids=lambda error: type(error).__name__)
def test_a_refusal_is_not_an_outage(error):
    assert not is_outage(wrapped(error))


def test_a_lost_or_refused_connection_is_an_outage():
    assert is_outage(wrapped(psycopg.OperationalError("connection refused")))
    # psycopg raises the server's own error for a refused statement; a PipelineAborted with
    # none behind it says the connection's state is broken, not the rows: wait, keep them
    assert is_outage(wrapped(psycopg.errors.PipelineAborted("pipeline aborted")))
    assert is_outage(ConnectionRefusedError())


class StuckStore(RefusingStore):
    """The first write waits for ``release`` (a store that stopped answering); others go."""

    def write(self, batch: Batch) -> None:
        if not self.retrying.is_set():
            self.retrying.set()
            self.release.wait(30)
        self.stored += [row.seq for row in batch.results]


class AwayStore(RefusingStore):
    """Every write fails as when the server is away."""

    def write(self, batch: Batch) -> None:
        self.alone += 1
        raise wrapped(psycopg.OperationalError("connection refused"))


def results(seqs) -> Batch:
    return Batch(results=[ResultRow("A/exp-0", seq, seq, {}) for seq in seqs])


def test_rows_left_when_the_writer_closes_are_counted_once_the_write_under_way_returns():
    """close() waits up to its timeout. The rows its thread is writing then are not given
    up: they may still be written. What waits behind them is, once that write returns
    (before: not counted at all, so nothing said rows were lost)."""
    store = StuckStore()
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(results(range(5)))
        wait_for(store.retrying.is_set)          # the thread holds them, in a write that hangs
        writer.submit(results(range(5, 8)))
        writer.close(timeout=0.2)
        assert writer.dropped == 0               # the write under way has not returned
        store.release.set()
        writer._thread.join(10)
        assert not writer._thread.is_alive()
        assert (writer.written, writer.dropped, writer.pending) == (5, 3, 0)
        assert store.stored == [0, 1, 2, 3, 4]
    finally:
        store.release.set()
        writer.close(timeout=5)


def test_a_store_away_at_close_gives_up_each_row_once_and_a_second_close_adds_nothing():
    store = AwayStore()
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(results(range(4)))
        wait_for(lambda: store.alone >= 1)       # tried, failed, put back: retried with backoff
        writer.close(timeout=0.2)
        writer._thread.join(10)
        assert (writer.written, writer.dropped, writer.pending) == (0, 4, 0)
        writer.close(timeout=0.2)
        assert writer.dropped == 4
        writer.submit(results(range(4, 6)))      # after close: nothing will write it
        assert (writer.dropped, writer.pending) == (6, 0)
    finally:
        writer.close(timeout=5)


class AwayAfterReleaseStore(RefusingStore):
    """The first write waits for ``release``, then fails as when the server is away."""

    def write(self, batch: Batch) -> None:
        self.retrying.set()
        self.release.wait(30)
        raise wrapped(psycopg.OperationalError("connection refused"))


def test_a_write_failing_after_close_does_not_sleep_its_backoff_before_giving_up(monkeypatch):
    """close() woke a thread that was not waiting yet: its backoff after the failed write
    (30 s here) must see the close, or the operator exits before the rows are counted."""
    monkeypatch.setattr(writer_module, "RETRY_SECONDS", (30.0,) * 6)
    store = AwayAfterReleaseStore()
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(results(range(3)))
        wait_for(store.retrying.is_set)
        writer.close(timeout=0.2)                # the write under way has not returned
        store.release.set()
        writer._thread.join(10)
        assert not writer._thread.is_alive()
        assert (writer.written, writer.dropped, writer.pending) == (0, 3, 0)
    finally:
        store.release.set()
        writer.close(timeout=5)


def test_a_refused_row_waiting_for_its_retry_at_close_is_given_up_once():
    store = RefusingStore()                      # seq BAD_SEQ refused; its second try alone hangs
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(results(range(20)))
        wait_for(lambda: len(store.stored) == 19)   # the rest is written; the bad row waits
        writer.close(timeout=0.1)
        store.release.set()
        writer._thread.join(10)
        assert not writer._thread.is_alive()
        assert (writer.written, writer.dropped, writer.pending, writer.rejected) == (19, 1, 0, {})
    finally:
        store.release.set()
        writer.close(timeout=5)


def test_rows_of_a_deleted_experiment_are_not_counted_as_lost_at_close_or_after(monkeypatch):
    """Rows of an Experiment forgotten while its write failed come back with the outage;
    at close they are not results anyone lost (the Experiment is gone), nor after it."""
    monkeypatch.setattr(writer_module, "RETRY_SECONDS", (30.0,) * 6)
    store = AwayAfterReleaseStore()
    writer = ResultsWriter(lambda: store)
    try:
        writer.submit(results(range(3)))
        wait_for(store.retrying.is_set)          # in flight: forget_experiment cannot drop them
        writer.forget_experiment("A")
        writer.close(timeout=0.2)
        store.release.set()                      # the write fails: put back, then given up
        writer._thread.join(10)
        assert (writer.dropped, writer.pending) == (0, 0)
        writer.submit(results(range(3, 5)))      # a last cycle's rows of the deleted Experiment
        assert writer.dropped == 0
        writer.forget_experiment("B")            # after close: nothing to remove, nothing to wait for
        assert writer.flush(timeout=0.2)
    finally:
        store.release.set()
        writer.close(timeout=5)


class RefusingAllStore(RefusingStore):
    def write(self, batch: Batch) -> None:
        raise wrapped(psycopg.errors.NumericValueOutOfRange("bigint out of range"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_writer_thread_does_not_make_flush_wait_out_its_timeout(monkeypatch):
    def broken(batch):
        raise RuntimeError("a bug")
    monkeypatch.setattr(writer_module, "halves", broken)
    writer = ResultsWriter(RefusingAllStore)
    writer.submit(results(range(4)))             # refused as a batch: halving it raises, the thread dies
    writer._thread.join(10)
    assert not writer._thread.is_alive()
    started = writer_module.time.monotonic()
    assert writer.flush(timeout=30) is False
    # a bound far from both outcomes (before: the whole 30 s; now: at once), not a timing
    assert writer_module.time.monotonic() - started < 25
    writer.close(timeout=0.2)
