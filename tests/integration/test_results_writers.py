"""Two writers of one trial at once (the chart's two replicas during a leader handover,
the old leader's writer still flushing) on SQLite and a real PostgreSQL server: the
trial's compact curve row (results/curves.py) ends up with every result either wrote,
and a dashboard's first read shows all of them.

The race is made, not hoped for: writer A is held inside its transaction, after it read
the trial's row and before it writes it back.  On PostgreSQL, writer B then writes, and
A is let go once B is seen waiting for it (in pg_locks) or has finished (what a writer
that does not wait does: then A's write drops B's point, and the test fails).  On
SQLite, B (told not to wait) is refused while A is held: A's read and write of the row
are one step under the database's write lock; B's batch, written again afterwards,
is merged into A's row."""
from __future__ import annotations

import threading

import pytest
import sqlalchemy

from kubetune.dashboard.storage import ResultsStoreStorage, study_id_of
from kubetune.results import Batch, ExperimentRow, ResultRow, TrialRow, open_store, schema
from kube_fixtures import wait_for
from postgres_fixtures import postgres_server, postgres_url  # noqa: F401

pytestmark = pytest.mark.integration
DEADLINE_S = 60.0


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("postgres_url")


def result(seq: int, loss: float) -> ResultRow:
    return ResultRow("race-t0", seq, seq, {"loss": loss}, time=1000.0 + seq)


def waiting_for_a_lock(store) -> bool:
    """PostgreSQL: some session of this database waits for a lock."""
    with store.engine.connect() as connection:
        return bool(connection.execute(sqlalchemy.text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()")).scalar())


def test_two_writers_of_one_trial_at_once_lose_no_point(store_url):
    setup = open_store(store_url)
    setup.write(Batch(experiments=[ExperimentRow("race-uid", "ns", "race", "loss", "min", "Running", 100.0)],
                      trials=[TrialRow("race-t0", "race-uid", "race-0", 0, {}, "Running")],
                      results=[result(0, 3.0)]))
    first, second = open_store(store_url), open_store(store_url)
    row_read, release, second_done = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold_before_the_row_is_written(conn, cursor, statement, *args) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO " + schema.curves.name.upper()):
            row_read.set()
            release.wait(DEADLINE_S)

    def run(store, batch, done=None) -> None:
        try:
            store.write(batch)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)
        finally:
            if done is not None:
                done.set()

    sqlalchemy.event.listen(first.engine, "before_cursor_execute", hold_before_the_row_is_written)
    # A: the higher seq, held after reading the row; B: the lower seq, meanwhile
    writer_a = threading.Thread(target=run, args=(first, Batch(results=[result(2, 1.0)])))
    writer_a.start()
    writer_b = None
    try:
        assert row_read.wait(DEADLINE_S), "writer A never reached the row's write"
        if first.backend == "postgresql":
            writer_b = threading.Thread(target=run, args=(second, Batch(results=[result(1, 2.0)]), second_done))
            writer_b.start()
            wait_for(lambda: second_done.is_set() or waiting_for_a_lock(setup), timeout=DEADLINE_S,
                     message="writer B to wait for writer A, or to finish")
        else:
            # SQLite: A holds the database's write lock from its first insert until its commit,
            # so its read of the row and its write are one step; B, not waiting, is refused
            sqlalchemy.event.listen(second.engine, "connect", lambda dbapi, _: dbapi.execute("PRAGMA busy_timeout = 0"))
            second.engine.dispose()
            with pytest.raises(sqlalchemy.exc.OperationalError, match="locked"):
                second.write(Batch(results=[result(1, 2.0)]))
    finally:
        release.set()
        writer_a.join(DEADLINE_S)
        if writer_b is not None:
            writer_b.join(DEADLINE_S)
    if writer_b is None:   # as the operator's writer does with a batch refused: again, later
        second.write(Batch(results=[result(1, 2.0)]))
    assert not errors
    assert not writer_a.is_alive() and (writer_b is None or not writer_b.is_alive())

    compact = open_store(store_url, read_only=True).compact_curves("race-uid", "loss")["race-t0"]
    assert (compact.results, compact.seq) == (3, 2)
    assert compact.intermediate() == {0: 3.0, 1: 2.0, 2: 1.0}
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    [trial] = storage.get_all_trials(study_id_of("race-uid"), deepcopy=False)
    assert trial.intermediate_values == {0: 3.0, 1: 2.0, 2: 1.0}
    for store in (setup, first, second, storage.store):
        store.close()
