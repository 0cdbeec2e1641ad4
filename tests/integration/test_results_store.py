"""The results store's behaviour, the same tests against SQLite and a real PostgreSQL
server (postgres_fixtures), as Optuna runs its storage tests against every storage."""
from __future__ import annotations

import json
import math
import time

import pytest
from sqlalchemy import text

from kubetune.results import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow, open_store
from kubetune.results.isolation import row_bytes
from kubetune.results.writer import ResultsWriter
from kube_fixtures import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def store(store_url):
    store = open_store(store_url)
    yield store
    store.close()


def experiment_batch(uid="exp-uid", name="exp", trials=2) -> Batch:
    return Batch(experiments=[ExperimentRow(uid, "team-a", name, "loss", "min", "Running")],
                 trials=[TrialRow(f"{uid}-t{i}", uid, f"{name}-{i}", i, {"lr": 0.1 * (i + 1), "opt": "adam"},
                                  "Running") for i in range(trials)])


def results(trial_uid: str, seqs, **metrics) -> list[ResultRow]:
    return [ResultRow(trial_uid, seq, seq + 1, {"loss": 1.0 / (seq + 1), **metrics}, time=1000.0 + seq, attempt=0)
            for seq in seqs]


def count(store, table: str) -> int:
    with store.engine.connect() as connection:
        return connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_non_finite_and_exotic_values_round_trip_faithfully(store):
    store.write(experiment_batch())
    reported = {"loss": math.nan, "up": math.inf, "down": -math.inf, "big": 2 ** 70, "step": 3,
                "note": "diverged", "ok": True, "tiny": 5e-324}
    store.write(Batch(results=[ResultRow("exp-uid-t0", 0, 1, reported, time=1.0, attempt=0)]))
    [stored] = store.results("exp-uid")
    assert math.isnan(stored.metrics["loss"])
    assert stored.metrics["up"] == math.inf and stored.metrics["down"] == -math.inf
    assert stored.metrics["big"] == 2 ** 70 and isinstance(stored.metrics["step"], int)
    assert stored.metrics["note"] == "diverged" and stored.metrics["ok"] is True
    assert stored.metrics["tiny"] == 5e-324
    with store.engine.connect() as connection:
        raw = dict(connection.execute(text(
            "SELECT name, value FROM kubetune_metrics WHERE name IN ('loss', 'up', 'down')")).all())
    # the database column itself holds the infinities (and, on PostgreSQL, the NaN)
    assert raw["up"] == math.inf and raw["down"] == -math.inf
    if store.backend == "postgresql":
        assert math.isnan(raw["loss"])
    else:   # SQLite turns a bound NaN into NULL; the row's kind says it was a number
        assert raw["loss"] is None


def test_writes_are_idempotent_per_trial_uid_and_seq(store, store_url):
    batch = experiment_batch()
    batch.results = results("exp-uid-t0", range(100)) + results("exp-uid-t1", range(50))
    store.write(batch)
    store.write(batch)                       # a retry of the whole batch
    again = open_store(store_url)            # a restarted operator delivering an overlap
    again.write(Batch(results=results("exp-uid-t0", range(90, 120))))
    again.close()
    assert count(store, "kubetune_results") == 170
    assert count(store, "kubetune_metrics") == 170
    assert count(store, "kubetune_trials") == 2
    assert count(store, "kubetune_experiments") == 1
    seqs = [r.seq for r in store.results("exp-uid", "exp-uid-t0")]
    assert seqs == list(range(120))


def test_a_reused_seq_keeps_the_newest_delivery(store):
    store.write(experiment_batch())
    store.write(Batch(results=[ResultRow("exp-uid-t0", 5, 6, {"loss": 9.0}, attempt=1)]))
    store.write(Batch(results=[ResultRow("exp-uid-t0", 5, 4, {"loss": 0.5}, attempt=2)]))
    [row] = store.results("exp-uid")
    assert (row.iteration, row.attempt, row.metrics["loss"]) == (4, 2, 0.5)


def test_trial_metadata_follows_the_newest_status(store):
    store.write(experiment_batch())
    store.write(Batch(experiments=[ExperimentRow("exp-uid", "team-a", "exp", "loss", "min", "Succeeded")],
                      trials=[TrialRow("exp-uid-t0", "exp-uid", "exp-0", 0, {"lr": 0.1, "opt": "adam"},
                                       "Succeeded", "Completed", best=0.25, iteration=40, attempt=1)]))
    trials = {t.name: t for t in store.trials("exp-uid")}
    assert trials["exp-0"].phase == "Succeeded" and trials["exp-0"].best == 0.25
    assert trials["exp-0"].params == {"lr": 0.1, "opt": "adam"}
    assert trials["exp-1"].phase == "Running"
    assert store.experiment("team-a", "exp").phase == "Succeeded"


def test_the_newest_experiment_of_a_name_is_found(store):
    store.write(Batch(experiments=[ExperimentRow("old", "team-a", "exp", created=100.0)]))
    store.write(Batch(experiments=[ExperimentRow("new", "team-a", "exp", created=200.0)]))
    store.write(Batch(experiments=[ExperimentRow("old", "team-a", "exp", phase="Failed", created=300.0)]))
    assert store.experiment("team-a", "exp").uid == "new"   # an update keeps the first-seen time
    assert store.experiment("team-b", "exp") is None


def test_a_failed_attempt_keeps_its_whole_traceback(store):
    store.write(experiment_batch())
    message = "ValueError: diverged\n" + "Traceback line\n" * 30_000   # ~450 kB
    store.write(Batch(failures=[FailureRow("exp-uid-t1", 0, "Error", message, 5.0)]))
    store.write(Batch(failures=[FailureRow("exp-uid-t1", 0, "Error", message, 5.0)]))
    [failure] = store.failures("exp-uid")
    assert failure.message == message and failure.attempt == 0
    assert count(store, "kubetune_failures") == 1


def test_the_writer_batches_many_results_and_reports_throughput(store, store_url):
    """2 trials x 10,000 results x 5 metrics through the operator's writer thread, handed
    over 500 at a time as the controller does per poll: every row lands, none dropped.
    (It was 30,000 a trial, the writer's work three times over for no other path; the
    throughput printed is a figure to read, never checked.)"""
    per_trial, trials = 10_000, ("exp-uid-t0", "exp-uid-t1")
    writer = ResultsWriter(lambda: open_store(store_url))
    writer.submit(experiment_batch())
    started = time.monotonic()
    for start in range(0, per_trial, 500):
        for trial in trials:
            writer.submit(Batch(results=[ResultRow(trial, seq, seq + 1, {f"m{k}": seq * 0.5 + k for k in range(5)},
                                                   time=float(seq), attempt=0)
                                         for seq in range(start, start + 500)]))
    assert writer.flush(timeout=300), f"still {writer.pending} rows pending: {writer.problem}"
    elapsed = time.monotonic() - started
    writer.close()
    results = per_trial * len(trials)
    print(f"\n{store.backend}: {results} results ({results * 5} metric rows) in {elapsed:.1f}s: "
          f"{results / elapsed:,.0f} results/s")
    assert count(store, "kubetune_results") == results
    assert count(store, "kubetune_metrics") == results * 5
    assert writer.problem is None and writer.dropped == 0


def test_a_database_outage_keeps_results_bounded_and_writes_them_later(postgres_server):
    """Real outage: the writer's database does not exist yet.  Rows wait (the newest
    ``max_pending_bytes``), the problem is reported, and all is written once it exists."""
    name = f"later_{int(time.time() * 1000)}"
    url = postgres_server.url(name)
    # room for the experiment and trial rows and 100 results (bounded in bytes: all are the same size)
    room = sum(row_bytes(row) for row in [*experiment_batch().experiments, *experiment_batch().trials,
                                          *results("exp-uid-t0", range(100))])
    writer = ResultsWriter(lambda: open_store(url), max_pending_bytes=room)
    writer.submit(experiment_batch())
    writer.submit(Batch(results=results("exp-uid-t0", range(150))))
    wait_for(lambda: writer.problem is not None, message="the writer to report the missing database")
    assert name in writer.problem
    assert writer.dropped == 50
    postgres_server.create_database(name)
    assert writer.flush(timeout=60), writer.problem
    writer.close()
    store = open_store(url)
    assert [r.seq for r in store.results("exp-uid")] == list(range(50, 150))   # the oldest went first
    assert {t.name for t in store.trials("exp-uid")} == {"exp-0", "exp-1"}
    store.close()
