"""The results store holds against anything a tenant reports (AUDIT N3, N5, N11), on
SQLite and on a real PostgreSQL server: text is made storable, a row the database
refuses is set aside against its own Experiment while every other Experiment's
results are written, the writer's buffer is bounded in bytes, and a deleted (or, with
retention, an old finished) Experiment's results are removed."""
from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import text

from kubetune.results import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow, open_store
from kubetune.results.isolation import row_bytes
from kubetune.results.writer import ResultsWriter
from kube_fixtures import wait_for

pytestmark = pytest.mark.integration

SURROGATE = json.loads('"bad \\udcff name"')    # what surrogateescape makes of a non-UTF-8 file name
NUL = "nul\x00byte"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("postgres_url")


def tenants(*uids: str) -> Batch:
    return Batch(experiments=[ExperimentRow(uid, f"team-{uid}", "exp", "loss", "min", "Running") for uid in uids],
                 trials=[TrialRow(f"{uid}-t0", uid, "exp-0", 0, {"lr": 0.1}, "Running") for uid in uids])


def results(trial_uid: str, seqs, **metrics) -> list[ResultRow]:
    return [ResultRow(trial_uid, seq, seq + 1, {"loss": 1.0 / (seq + 1), **metrics}, time=1.0 + seq, attempt=0)
            for seq in seqs]


def count(store, table: str) -> int:
    with store.engine.connect() as connection:
        return connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_any_text_a_trial_reports_is_stored_on_every_backend(store_url):
    store = open_store(store_url)
    try:
        store.write(Batch(
            experiments=[ExperimentRow("A", "team-a", "exp", f"loss{NUL}", "min", "Running")],
            trials=[TrialRow("A-t0", "A", "exp-0", 0, {SURROGATE: NUL}, "Failed", reason=f"{SURROGATE}{NUL}")],
            results=[ResultRow("A-t0", 0, 1, {SURROGATE: SURROGATE, NUL: NUL, "ok": 1.5, "list": [SURROGATE, NUL]},
                               checkpoint=f"/c/{SURROGATE}")],
            failures=[FailureRow("A-t0", 0, "Error", f"FileNotFoundError: {SURROGATE}\n{NUL}", 1.0)]))
        [row] = store.results("A")
        assert row.metrics["ok"] == 1.5
        assert row.metrics["bad \ufffd name"] == "bad \ufffd name" and row.metrics["nul\ufffdbyte"] == "nul\ufffdbyte"
        assert row.metrics["list"] == [SURROGATE, NUL]     # JSON text keeps them escaped, exactly
        assert row.checkpoint == "/c/bad \ufffd name"
        [failure] = store.failures("A")
        assert failure.message == "FileNotFoundError: bad \ufffd name\nnul\ufffdbyte"
        [trial] = store.trials("A")
        assert trial.reason == "bad \ufffd namenul\ufffdbyte" and trial.params == {SURROGATE: NUL}
    finally:
        store.close()


def test_a_refused_row_is_set_aside_against_its_experiment_and_the_others_are_written(store_url):
    """Tenant A reports values no backend can hold (an iteration past 2^63, an attempt past
    2^31 on PostgreSQL), amid good results of A and B, in the same batches."""
    writer = ResultsWriter(lambda: open_store(store_url))
    try:
        writer.submit(tenants("A", "B"))
        a = results("A-t0", range(2000))
        a[700] = ResultRow("A-t0", 700, 2 ** 64, {"loss": 0.5})
        a[1500] = ResultRow("A-t0", 1500, 3, {"loss": 0.5}, attempt=2 ** 64)
        writer.submit(Batch(results=a[:1000] + results("B-t0", range(1000))))
        writer.submit(Batch(results=a[1000:] + results("B-t0", range(1000, 2000))))
        assert writer.flush(timeout=120), f"{writer.pending} rows still pending: {writer.problem}"
        store = writer.store
        assert [r.seq for r in store.results("B")] == list(range(2000))
        assert [r.seq for r in store.results("A")] == [s for s in range(2000) if s not in (700, 1500)]
        rejected = writer.rejection("A")
        assert rejected is not None and rejected.rows == 2 and rejected.example == "result seq 700"
        assert writer.rejection("B") is None and writer.problem is None and writer.dropped == 0
        writer.submit(Batch(results=results("B-t0", range(2000, 2100))))   # and B goes on being written
        assert writer.flush(timeout=60)
        assert count(store, "kubetune_results") == 1998 + 2100
    finally:
        writer.close()


def test_the_pending_results_are_bounded_in_bytes_during_an_outage(postgres_server):
    """The store's database does not exist yet.  Big results (200 metrics each) wait within
    the byte bound, the oldest dropped first; the high-water mark says how full it got."""
    name = f"later_{int(time.time() * 1000)}"
    url = postgres_server.url(name)
    one = results("A-t0", [0], **{f"metric_{k}": float(k) for k in range(200)})[0]
    bound = 50 * row_bytes(one)
    writer = ResultsWriter(lambda: open_store(url), max_pending_bytes=bound)
    try:
        writer.submit(tenants("A"))
        for start in range(0, 200, 20):
            writer.submit(Batch(results=results("A-t0", range(start, start + 20),
                                                **{f"metric_{k}": float(k) for k in range(200)})))
            assert writer.pending_bytes <= bound
        wait_for(lambda: writer.problem is not None, message="the writer to report the missing database")
        assert writer.pending_bytes <= bound and bound // 2 < writer.high_water_bytes <= bound
        assert 150 - 2 <= writer.dropped <= 150 + 2       # 50 of 200 fit, less the trial and experiment rows
        postgres_server.create_database(name)
        assert writer.flush(timeout=60), writer.problem
        stored = [r.seq for r in writer.store.results("A")]
        # the oldest went first (a batch being written when the outage began was not droppable)
        assert len(stored) == 200 - writer.dropped and stored[-30:] == list(range(170, 200))
    finally:
        writer.close()


def test_a_deleted_experiments_results_are_removed_and_later_rows_ignored(store_url):
    writer = ResultsWriter(lambda: open_store(store_url))
    try:
        writer.submit(tenants("A", "B"))
        writer.submit(Batch(results=results("A-t0", range(300)) + results("B-t0", range(300)),
                            failures=[FailureRow("A-t0", 0, "Error", "boom", 1.0)]))
        writer.submit(Batch(results=results("A/exp-9", range(5))))   # a trial whose UID was not known yet
        assert writer.flush(timeout=60)
        writer.forget_experiment("A")
        writer.submit(Batch(results=results("A-t0", range(300, 310))))   # a last cycle's, after the deletion
        assert writer.flush(timeout=60)
        store = writer.store
        assert store.results("A") == [] and store.trials("A") == [] and store.failures("A") == []
        assert store.experiment("team-A", "exp") is None
        assert count(store, "kubetune_results") == 300 and count(store, "kubetune_metrics") == 300
        assert len(store.results("B")) == 300
    finally:
        writer.close()


def test_retention_removes_finished_experiments_older_than_it(store_url):
    day = 86400.0
    now = 100 * day
    store = open_store(store_url)
    store.write(Batch(experiments=[ExperimentRow("old-done", "a", "x", phase="Succeeded", created=now - 40 * day),
                                   ExperimentRow("old-failed", "a", "y", phase="Failed", created=now - 31 * day),
                                   ExperimentRow("old-running", "a", "z", phase="Running", created=now - 40 * day),
                                   ExperimentRow("new-done", "b", "x", phase="Succeeded", created=now - day)],
                      trials=[TrialRow(f"{uid}-t0", uid, "t", 0) for uid in ("old-done", "old-failed",
                                                                             "old-running", "new-done")],
                      results=[r for uid in ("old-done", "old-failed", "old-running", "new-done")
                               for r in results(f"{uid}-t0", range(10))]))
    store.close()
    writer = ResultsWriter(lambda: open_store(store_url), retention_s=30 * day, clock=lambda: now)
    try:
        wait_for(lambda: {e.uid for e in writer.read(lambda s: s.experiments())} == {"old-running", "new-done"},
                 message="retention to remove the finished experiments older than 30 days")
        assert count(writer.store, "kubetune_results") == 20
    finally:
        writer.close()
