"""The results store as a read-only Optuna storage (kubetune.dashboard), on SQLite and a
real PostgreSQL server: what Optuna itself reads through it (``optuna.load_study``),
live changes, read-only enforcement by the database, and a database an older
kubetune wrote (without the ``study`` column)."""
from __future__ import annotations

import json
import math
import threading
import time
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pytest
import sqlalchemy
from optuna.trial import TrialState

from kubetune.dashboard import dashboard_compat, detail as detail_module, storage as storage_module
from kubetune.dashboard.server import make_app
from kubetune.dashboard.snapshot import Snapshots
from kubetune.dashboard.storage import ReadOnlyStorageError, ResultsStoreStorage, study_id_of
from kubetune.results import Batch, ExperimentRow, ResultRow, TrialRow, curves as curve_rows, open_store, schema
from kubetune.results.study_meta import study_json
from kubetune.spec.model import Constraint
from kube_fixtures import wait_for
from optuna.distributions import CategoricalDistribution, FloatDistribution
from postgres_fixtures import postgres_server, postgres_url  # noqa: F401

pytestmark = pytest.mark.integration
STUDY = study_json([("loss", "min"), ("size", "max")], [Constraint("memory", max=2.0)],
                   {"lr": FloatDistribution(1e-4, 1e-1, log=True), "opt": CategoricalDistribution(["adam", "sgd"])})


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return request.getfixturevalue("postgres_url")


def trial(index: int, phase: str, **params) -> TrialRow:
    return TrialRow(f"uid-{index}", "exp-uid", f"exp-{index}", index, params or {"lr": 0.01, "opt": "adam"}, phase)


def reports(index: int, rows: list[dict], start: int = 0) -> list[ResultRow]:
    return [ResultRow(f"uid-{index}", start + i, start + i + 1, metrics, time=1000.0 + index * 10 + i)
            for i, metrics in enumerate(rows)]


@pytest.fixture
def written(store_url):
    """An Experiment of four trials: complete, failed, stopped early, running."""
    store = open_store(store_url)
    store.write(Batch(
        experiments=[ExperimentRow("exp-uid", "team-a", "exp", "loss", "min", "Running", 100.0, STUDY)],
        trials=[trial(0, "Succeeded"), trial(1, "Failed", lr=0.05, opt="sgd"), trial(2, "Stopped"),
                trial(3, "Running")],
        results=reports(0, [{"loss": 2.0, "size": 1, "memory": 1.0}, {"loss": 1.5, "size": 3, "memory": 3.0}])
        + reports(1, [{"loss": float("nan"), "size": 1, "memory": 1.0}])
        + reports(2, [{"loss": 4.0, "size": 1, "memory": 1.0}, {"loss": float("inf"), "size": 1, "memory": 1.0}])
        + reports(3, [{"loss": 0.5, "size": 9, "memory": 0.5, "note": "text"}])))
    yield store
    store.close()


def load(storage: ResultsStoreStorage) -> optuna.Study:
    [study] = storage.get_all_studies()
    return optuna.load_study(study_name=study.study_name, storage=storage)


def test_optuna_reads_an_experiment_as_a_multi_objective_study(written, store_url):
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    study = load(storage)
    assert study.study_name == "team-a/exp" and study._study_id == study_id_of("exp-uid")
    assert study.directions == [optuna.study.StudyDirection.MINIMIZE, optuna.study.StudyDirection.MAXIMIZE]
    assert study.metric_names == ["loss", "size"]
    assert study.user_attrs["phase"] == "Running"
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.RUNNING]
    done = trials[0]
    assert done.values == [1.5, 3.0]                            # the last result's objectives
    assert done.intermediate_values == {1: 2.0, 2: 1.5}          # every result, by iteration
    assert done.system_attrs["constraints"] == [1.0]             # memory 3.0 > max 2.0: infeasible by 1
    assert done.params == {"lr": 0.01, "opt": "adam"} and done.distributions["lr"].log
    assert done.user_attrs == {"trial": "exp-0", "phase": "Succeeded"}
    assert done.datetime_start.timestamp() == 1000.0 and done.datetime_complete.timestamp() == 1001.0
    assert math.isnan(trials[1].intermediate_values[1])          # a NaN report is kept as NaN
    assert trials[2].intermediate_values == {1: 4.0, 2: math.inf} and trials[2].values is None
    assert trials[3].values is None and trials[3].intermediate_values == {1: 0.5}
    assert study.best_trials == []   # the only complete trial breaks its constraint
    # trial IDs round-trip
    assert storage.get_trial(done._trial_id).number == 0
    assert storage.get_trial_id_from_study_id_trial_number(study._study_id, 3) == trials[3]._trial_id


def test_every_write_is_refused_by_the_storage_and_by_the_database(written, store_url):
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    study = load(storage)
    with pytest.raises(ReadOnlyStorageError, match="read-only"):
        study.set_user_attr("note", "x")
    with pytest.raises(ReadOnlyStorageError):
        optuna.create_study(storage=storage, study_name="new")
    with pytest.raises(ReadOnlyStorageError):
        storage.set_trial_state_values(study.trials[3]._trial_id, TrialState.COMPLETE, [1.0, 1.0])
    with pytest.raises(PermissionError, match="read-only"):
        storage.store.write(Batch(experiments=[ExperimentRow("other", "team-a", "other")]))
    # below the store: the connection itself cannot write (SQLite mode=ro, PostgreSQL read-only sessions)
    with pytest.raises(sqlalchemy.exc.DBAPIError):
        with storage.store.engine.begin() as connection:
            connection.execute(schema.experiments.delete())
    assert len(load(storage).trials) == 4


def test_new_trials_and_results_appear_and_only_what_changed_is_read_again(written, store_url, monkeypatch):
    monkeypatch.setattr(storage_module, "TRIALS_TTL_SECONDS", 0.0)
    monkeypatch.setattr(storage_module, "SETTLE_SECONDS", 0.0)
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    study_id = storage.get_all_studies()[0]._study_id
    first = storage.get_all_trials(study_id, deepcopy=False)
    asked: list = []
    original, compact = storage.store.curves, storage.store.compact_curves
    monkeypatch.setattr(storage.store, "curves", lambda uid, metric, which=None: asked.append(("metric rows", which))
                        or original(uid, metric, which))
    monkeypatch.setattr(storage.store, "compact_curves", lambda uid, metric, which=None:
                        asked.append(("compact", which)) or compact(uid, metric, which))
    storage.get_all_trials(study_id, deepcopy=False)
    assert asked == []                                           # nothing changed: no result read
    written.write(Batch(trials=[trial(3, "Succeeded"), trial(4, "Running")],
                      results=reports(3, [{"loss": 0.4, "size": 9, "memory": 0.5}], start=1)
                      + reports(4, [{"loss": 3.0, "size": 2, "memory": 0.1}])))
    trials = storage.get_all_trials(study_id, deepcopy=False)
    # only the two trials that changed, from their compact rows (the writer's, results/curves.py)
    assert asked == [("compact", ["uid-3", "uid-4"])]
    assert len(trials) == 5 and trials[0] is first[0]           # an unchanged trial is the same object
    assert trials[3].state == TrialState.COMPLETE and trials[3].values == [0.4, 9.0]
    assert trials[3].intermediate_values == {1: 0.5, 2: 0.4}
    assert trials[4].state == TrialState.RUNNING
    # finished and quiet: settled, no longer counted; a retry (row changed) is watched again
    storage.get_all_trials(study_id, deepcopy=False)
    counted: list = []
    stats = storage.store.result_stats
    monkeypatch.setattr(storage.store, "result_stats", lambda uid, which=None: counted.append(which) or
                        stats(uid, which))
    storage.get_all_trials(study_id, deepcopy=False)
    assert counted == [["uid-4"]]
    assert storage.get_all_trials(study_id, states=(TrialState.RUNNING,))[0].number == 4


def test_a_recreated_experiment_is_a_second_study_and_the_newest_keeps_the_name(written, store_url):
    written.write(Batch(experiments=[ExperimentRow("exp-uid-2", "team-a", "exp", "loss", "min", "Running", 200.0,
                                                   STUDY)]))
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    names = {s.study_name: s._study_id for s in storage.get_all_studies()}
    assert names == {"team-a/exp (uid exp-uid)": study_id_of("exp-uid"), "team-a/exp": study_id_of("exp-uid-2")}
    assert storage.study_id_for("team-a", "exp") == study_id_of("exp-uid-2")


def test_the_writers_compact_curve_rows_read_as_the_metric_rows_do(written, store_url, monkeypatch):
    """The study view reads a trial's curve from the one row the writer keeps with its
    results (results/curves.py) when that row was made from every stored result; the
    trials it cannot use (a seq delivered again, results before the trial row or the
    table, more iterations than a row holds) are rebuilt by the writer or read from the
    metric rows: either way the same trials (curves, last values) as from the metric rows alone."""
    monkeypatch.setattr(curve_rows, "MAX_POINTS", 4)
    uid = "curve-uid"
    rows = [TrialRow(f"c-{name}", uid, f"c-{name}", i, {"x": i}, ("Succeeded", "Running")[i % 2])
            for i, name in enumerate("abcdef")]

    def result(name: str, seq: int, iteration: int, **metrics) -> ResultRow:
        return ResultRow(f"c-{name}", seq, iteration, metrics, time=3000.0 + seq)

    written.write(Batch(experiments=[ExperimentRow(uid, "team-a", "curves", "acc", "max", "Running", 300.0,
                                                   study_json([("loss", "min")], [Constraint("memory", max=2.0)],
                                                              {}))],
                        trials=[r for r in rows if r.name != "c-c"],
                        results=[result("a", 0, 1, loss=2.0), result("a", 1, 1, loss=1.0),    # first per iteration
                                 result("a", 2, 2, loss=float("nan")), result("a", 3, 3, acc=1.0),
                                 result("b", 0, 0, loss=5.0), result("b", 1, 1, loss=4.0),
                                 result("c", 0, 0, loss=1.0),                               # no trial row yet
                                 result("d", 0, 0, loss=3.0), result("e", 0, 0, loss=3.0)]
                        + [result("f", seq, seq, loss=float(seq)) for seq in range(3)]))
    with written.engine.begin() as connection:   # as an older kubetune left them: no row
        connection.execute(schema.curves.delete().where(schema.curves.c.trial_uid.in_(["c-d", "c-e"])))
    written.write(Batch(trials=[rows[2]],
                        results=[result("a", 4, 4, loss=float("inf")), result("a", 5, 5, loss="text"),
                                 result("a", 6, 6, loss=7, memory=3.0),
                                 result("b", 1, 9, loss=0.5), result("b", 2, 2, loss=0.25),   # seq 1 again
                                 result("c", 1, 1, loss=0.5, memory=1), result("d", 1, 1, loss=2.0),
                                 result("f", 3, 3, loss=3.0), result("f", 4, 4, loss=4.0)]))  # past MAX_POINTS

    store = open_store(store_url, read_only=True)
    compact = store.compact_curves(uid, "loss")
    assert sorted(compact) == ["c-a", "c-b", "c-c", "c-d"]      # e: none written since; f: given up (overflow)
    assert list(compact["c-a"].intermediate()) == [1, 2, 4, 6] and compact["c-a"].results == 7   # 5 reported text: not a point
    assert compact["c-b"].intermediate() == {0: 5.0, 9: 0.5, 2: 0.25}
    assert compact["c-a"].last == {"loss": 7.0, "memory": 3.0} and compact["c-c"].last == {"loss": 0.5, "memory": 1.0}
    with written.engine.connect() as connection:
        given_up = connection.execute(schema.curves.select().where(schema.curves.c.trial_uid == "c-f")).one()
    assert given_up.overflow == 1 and given_up.steps == b"" and given_up.step_values == b""

    def seen(storage: ResultsStoreStorage) -> list:
        return [(t.number, json.dumps(sorted(t.intermediate_values.items())), t.datetime_start, t.datetime_complete,
                 t.state, t.values, t.system_attrs) for t in storage.get_all_trials(study_id_of(uid), deepcopy=False)]

    ours = seen(ResultsStoreStorage(store))
    metric_rows_only = ResultsStoreStorage(open_store(store_url, read_only=True))
    monkeypatch.setattr(metric_rows_only.store, "compact_curves", lambda *args, **kwargs: {})
    assert ours == seen(metric_rows_only)
    assert ours[0][5:] == ([7.0], {"constraints": [1.0]}) and ours[2][5:] == ([0.5], {"constraints": [-1.0]})
    assert ours[0][1] == json.dumps([[1, 2.0], [2, math.nan], [4, math.inf], [6, 7.0]])
    assert ours[5][1] == json.dumps([[i, float(i)] for i in range(5)])   # every point, from the metric rows
    store.close()
    metric_rows_only.store.close()


def test_a_rows_points_json_is_the_views_batch_after_batch_and_unused_once_stale(written, store_url):
    """The JSON a compact row keeps of its points (curves.encode_points), which the
    study-detail body splices in as it is, is what optuna-dashboard makes of them,
    appended batch after batch; a row holds none when its points need more than that
    form (NaN, steps out of order), and one whose points an older kubetune changed
    without it (its CRC no longer theirs) is not used: readers format the points."""
    written.write(Batch(results=reports(0, [{"loss": 1.25, "size": 2, "memory": 1.0}], start=2)
                        + reports(3, [{"loss": 1e-05}, {"loss": 0.25}], start=1)))
    written.write(Batch(results=reports(3, [{"loss": 3e16}], start=3)))
    compact = open_store(store_url, read_only=True).compact_curves("exp-uid", "loss")
    for uid, row in compact.items():
        steps, numbers = (curve_rows.unpack(kind, data) for kind, data in zip("qd", row.packed))
        if uid in ("uid-1", "uid-2"):     # NaN, infinity: written as strings by the view
            assert row.points_json is None
            continue
        assert json.loads(row.points_json) == [{"step": s, "value": v} for s, v in zip(steps, numbers)]
        assert row.encoded == len(steps)
    assert [p["value"] for p in json.loads(compact["uid-3"].points_json)] == [0.5, 1e-05, 0.25, 3e16]
    study_id = study_id_of("exp-uid")
    fresh = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)), warm=False)
    expected = fresh.kubetune_details.body(study_id, 0)
    with written.engine.begin() as connection:   # an older kubetune rewrote uid-3's points: the JSON stays
        connection.execute(schema.curves.update().where(schema.curves.c.trial_uid == "uid-3")
                           .values(step_values=curve_rows.to_row("uid-3", curve_rows.CompactCurve(
                               "loss", steps=[1, 2, 3, 4], values=[0.5, 1e-05, 0.25, 7.0]))["step_values"]))
    stale = open_store(store_url, read_only=True).compact_curves("exp-uid", "loss")["uid-3"]
    assert stale.points_json is None
    with written.engine.begin() as connection:   # JSON changed by hand: never spliced into a page
        connection.execute(schema.curves.update().where(schema.curves.c.trial_uid == "uid-2")
                           .values(points_json=b'[{"step": 1, "value": </script>'))
    assert open_store(store_url, read_only=True).compact_curves("exp-uid", "loss")["uid-2"].points_json is None
    app = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)), warm=False)
    served = json.loads(app.kubetune_details.body(study_id, 0))
    assert [p["value"] for p in served["trials"][3]["intermediate_values"]] == [0.5, 1e-05, 0.25, 7.0]
    before = json.loads(expected)
    before["trials"][3]["intermediate_values"][-1]["value"] = 7.0
    assert served["trials"] == before["trials"]


def test_a_first_read_counts_only_the_trials_whose_row_is_behind(written, store_url, monkeypatch):
    """A cold opening does not count every result to check the compact rows: a row no
    stored result is past is current (the writer keeps it in the results' transaction).
    A result stored without its row (as an older kubetune writes) puts its trial's row
    behind: that trial alone is counted and read from the metric rows."""
    with written.engine.begin() as connection:   # an older kubetune's write: results and metrics, no row
        connection.execute(schema.results.insert().values(trial_uid="uid-0", seq=2, iteration=3, time=1002.0))
        connection.execute(schema.metrics.insert().values(trial_uid="uid-0", seq=2, name="loss", kind="f", value=0.75))
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    counted: list = []
    stats = storage.store.result_stats
    monkeypatch.setattr(storage.store, "result_stats", lambda uid, which=None: counted.append(which) or
                        stats(uid, which))
    trials = storage.get_all_trials(study_id_of("exp-uid"), deepcopy=False)
    assert counted == [["uid-0"]]
    assert trials[0].intermediate_values == {1: 2.0, 2: 1.5, 3: 0.75}
    metric_rows_only = ResultsStoreStorage(open_store(store_url, read_only=True))
    monkeypatch.setattr(metric_rows_only.store, "compact_curves", lambda *args, **kwargs: {})
    def seen(trials: list) -> list:   # NaN != NaN: the curves compared as JSON
        return [(t.number, t.state, t.values, t.params, t.system_attrs, t.datetime_start, t.datetime_complete,
                 json.dumps(sorted(t.intermediate_values.items()))) for t in trials]
    assert seen(trials) == seen(metric_rows_only.get_all_trials(study_id_of("exp-uid"), deepcopy=False))
    assert storage.kept_key(study_id_of("exp-uid"), trials) == storage.state_key(study_id_of("exp-uid"))
    storage.store.close()
    metric_rows_only.store.close()


def test_a_trials_next_results_do_not_count_the_results_it_has(written):
    """Keeping a trial's row costs the same at its 10th result as at its 100,000th: only a
    row made afresh is checked against a count of the stored results (it cost 45 ms a
    batch at 200,000 results when every batch counted them)."""
    statements: list[str] = []

    def seen(conn, cursor, statement, *args):
        statements.append(statement.lower())
    sqlalchemy.event.listen(written.engine, "before_cursor_execute", seen)
    try:
        written.write(Batch(results=reports(0, [{"loss": 1.0, "size": 2, "memory": 1.0}], start=2)))
        kept_row = [s for s in statements if "count(" in s]
        statements.clear()
        written.write(Batch(trials=[trial(4, "Running")], results=reports(4, [{"loss": 9.0}])))   # no row yet
        fresh_row = [s for s in statements if "count(" in s]
    finally:
        sqlalchemy.event.remove(written.engine, "before_cursor_execute", seen)
    assert kept_row == [] and len(fresh_row) == 1 and schema.results.name in fresh_row[0]
    compact = open_store(written.url, read_only=True).compact_curves("exp-uid", "loss")
    assert compact["uid-0"].results == 3 and compact["uid-4"].results == 1


def test_a_database_written_before_the_study_column_is_read_and_migrated(store_url):
    engine = sqlalchemy.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    old = sqlalchemy.MetaData()
    experiments = sqlalchemy.Table(schema.experiments.name, old,
                                   *[c._copy() for c in schema.experiments.columns if c.name != "study"])
    old.create_all(engine)
    schema.metadata.create_all(engine)      # the other tables as they are (experiments exists: kept)
    with engine.begin() as connection:
        connection.execute(experiments.insert().values(
            uid="exp-uid", namespace="team-a", name="exp", metric="acc", mode="max", phase="Succeeded", created=1.0))
        connection.execute(schema.trials.insert().values(uid="uid-0", experiment_uid="exp-uid", name="exp-0",
                                                         index=0, params='{"layers": 3}', phase="Succeeded"))
    engine.dispose()
    # read-only: nothing added, the single objective from metric/mode, distributions from the values
    reader = ResultsStoreStorage(open_store(store_url, read_only=True))
    study = load(reader)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE]
    assert study.trials[0].distributions["layers"] == optuna.distributions.IntDistribution(3, 3)
    assert study.trials[0].state == TrialState.PRUNED           # succeeded but never reported acc
    # a writer adds the column; existing rows read as "" and new ones keep their study
    writer = open_store(store_url)
    assert writer.experiments()[0].study == ""
    writer.write(Batch(experiments=[ExperimentRow("exp-uid", "team-a", "exp", "acc", "max", "Succeeded", 1.0,
                                                  STUDY)]))
    assert writer.experiments()[0].study == STUDY
    writer.close()
    reader.store.close()


def test_the_dashboard_serves_before_the_sqlite_file_exists(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_module, "STUDIES_TTL_SECONDS", 0.0)
    url = f"sqlite:///{tmp_path / 'later.db'}"
    storage = ResultsStoreStorage(lambda: open_store(url, read_only=True))
    assert storage.get_all_studies() == []
    store = open_store(url)
    store.write(Batch(experiments=[ExperimentRow("e", "ns", "late", "loss", "min", "Running", time.time())]))
    [study] = storage.get_all_studies()
    assert study.study_name == "ns/late"
    store.close()


# ---------------------------------------------------------------------- the study-detail API


def api(app, path: str) -> tuple[str, object]:
    """One GET through a WSGI app, as a browser's fetch would: (status, parsed JSON)."""
    path, _, query = path.partition("?")
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, QUERY_STRING=query)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], json.loads(body)


def test_the_study_detail_api_answers_what_optuna_dashboards_own_view_does(written, store_url, monkeypatch,
                                                                          request):
    """kubetune answers ``/api/studies/<id>`` from JSON kept per trial (dashboard/detail.py);
    optuna-dashboard's own view, over the same store, is the reference: same body, for a
    multi-objective study (Pareto front) and a single-objective one (best trial), for
    every ``after`` the page sends, and after trials change and are added."""
    monkeypatch.setattr(storage_module, "TRIALS_TTL_SECONDS", 0.0)
    monkeypatch.setattr(detail_module, "STALE_LIMIT_SECONDS", 0.0)   # every request reads the store again
    written.write(Batch(experiments=[ExperimentRow("single-uid", "team-a", "single", "loss", "min", "Running", 200.0,
                                                   study_json([("loss", "min")], [Constraint("memory", max=2.0)],
                                                              {}))],
                        trials=[TrialRow(f"s-{i}", "single-uid", f"single-{i}", i, {"x": i}, "Succeeded")
                                for i in range(3)],
                        results=[ResultRow(f"s-{i}", 0, 1, {"loss": 3.0 - i}, time=2000.0 + i) for i in range(3)]))
    ours = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)), warm=True)
    theirs = optuna_dashboard.wsgi(ResultsStoreStorage(open_store(store_url, read_only=True)))
    assert ours.kubetune_details.warmed.wait(60) and ours.kubetune_details.warm_seconds is not None
    multi, single = study_id_of("exp-uid"), study_id_of("single-uid")

    def same(study_id: int, after: int) -> dict:
        for app in (ours, theirs):   # both see the store as it is now (the dashboard's own cache: ~2 s)
            dashboard_compat.app_cache(app).clear()
        status, body = api(ours, f"/api/studies/{study_id}?after={after}")
        assert (status, body) == api(theirs, f"/api/studies/{study_id}?after={after}")
        assert status.startswith("200"), body
        return body

    body = same(multi, 0)
    assert [t["number"] for t in body["trials"]] == [0, 1, 2, 3] and body["trials"][0]["intermediate_values"]
    # the dashboard's Pareto front ignores constraints (Optuna's own best_trials would not show 0)
    assert [t["number"] for t in body["best_trials"]] == [0] and body["directions"] == ["minimize", "maximize"]
    assert [t["number"] for t in same(multi, 3)["trials"]] == [3]     # the page's poll: from the first running
    assert same(multi, 4)["trials"] == []
    assert [t["number"] for t in same(single, 0)["best_trials"]] == [2]
    written.write(Batch(trials=[trial(3, "Succeeded"), trial(4, "Running")],
                        results=reports(3, [{"loss": 0.4, "size": 9, "memory": 0.5}], start=1)
                        + reports(4, [{"loss": 3.0, "size": 2, "memory": 0.1}])))
    body = same(multi, 3)
    assert [(t["number"], t["state"]) for t in body["trials"]] == [(3, "Complete"), (4, "Running")]
    assert [t["number"] for t in body["best_trials"]] == [3]          # dominates trial 0 now
    same(multi, 0)
    # errors as optuna-dashboard words them
    assert api(ours, "/api/studies/12345") == api(theirs, "/api/studies/12345")
    assert api(ours, f"/api/studies/{multi}?after=-1") == api(theirs, f"/api/studies/{multi}?after=-1")


def test_a_page_gets_the_last_body_at_once_and_what_changed_on_its_next_poll(written, store_url, monkeypatch):
    """A body younger than a minute is answered without reading the store; one older than
    REFRESH_SECONDS is also made again in the background, so the next poll shows a new trial."""
    monkeypatch.setattr(storage_module, "TRIALS_TTL_SECONDS", 0.0)
    monkeypatch.setattr(detail_module, "REFRESH_SECONDS", 0.0)
    app = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)), warm=False)
    study_id = study_id_of("exp-uid")
    assert len(api(app, f"/api/studies/{study_id}")[1]["trials"]) == 4
    written.write(Batch(trials=[trial(4, "Running")], results=reports(4, [{"loss": 3.0, "size": 2, "memory": 0.1}])))
    dashboard_compat.app_cache(app).clear()
    assert len(api(app, f"/api/studies/{study_id}")[1]["trials"]) == 4   # the last body, the store not read
    deadline = time.monotonic() + 60
    while True:   # each poll also asks for a refresh; the dashboard's own trial list lives ~2 s
        dashboard_compat.app_cache(app).clear()
        trials = api(app, f"/api/studies/{study_id}")[1]["trials"]
        if len(trials) == 5:
            break
        assert len(trials) == 4 and time.monotonic() < deadline, "the new trial never appeared"
        time.sleep(0.05)
    assert trials[4]["state"] == "Running" and trials[4]["intermediate_values"] == [{"step": 1, "value": 3.0}]
    # a deleted Experiment: its kept body goes, its page answers 404 (at the latest on a later poll)
    written.delete_experiment("exp-uid")
    monkeypatch.setattr(storage_module, "STUDIES_TTL_SECONDS", 0.0)
    wait_for(lambda: api(app, f"/api/studies/{study_id}")[0].startswith("404"), timeout=60, interval=0.05,
             message="the deleted Experiment's page to answer 404")
    assert study_id not in app.kubetune_details._pieces


def test_a_restarted_dashboard_answers_from_the_kept_page_until_the_store_changes(written, store_url, tmp_path,
                                                                                  monkeypatch):
    """The keeper keeps each study's body on disk (dashboard/snapshot.py): a new dashboard
    answers the first opening with it, without reading the trials from the store, while
    the store still holds what it was made of; once the store changed, from the store."""
    cache, multi = tmp_path / "cache", study_id_of("exp-uid")

    def dashboard(*, warm: bool):
        storage = ResultsStoreStorage(open_store(store_url, read_only=True))
        return storage, make_app(storage, warm=warm, snapshots=Snapshots(cache, store_url, 1 << 30))

    monkeypatch.setattr(detail_module, "KEEP_SECONDS", 0.05)   # kept once unchanged for a round
    storage, first = dashboard(warm=True)
    wait_for_kept(cache)
    first.kubetune_details.stop()
    kept = first.kubetune_details.body(multi, 0)
    assert len(list(cache.glob("*.study"))) == 1
    theirs = optuna_dashboard.wsgi(ResultsStoreStorage(open_store(store_url, read_only=True)))
    assert json.loads(kept) == api(theirs, f"/api/studies/{multi}?after=0")[1]

    storage, restarted = dashboard(warm=False)
    assert restarted.kubetune_details.body(multi, 0) == kept
    assert restarted.kubetune_details.body(multi, 3) == first.kubetune_details.body(multi, 3)   # a poll
    assert multi not in storage._caches, "the trials were read from the store: the kept page was not used"

    written.write(Batch(trials=[trial(3, "Succeeded")],
                        results=reports(3, [{"loss": 0.4, "size": 9, "memory": 0.5}], start=1)))
    storage, changed = dashboard(warm=False)
    body = json.loads(changed.kubetune_details.body(multi, 0))
    assert multi in storage._caches and body["trials"][3]["state"] == "Complete"
    theirs = optuna_dashboard.wsgi(ResultsStoreStorage(open_store(store_url, read_only=True)))   # none cached
    assert body == api(theirs, f"/api/studies/{multi}?after=0")[1] != json.loads(kept)


def test_the_readiness_route_waits_for_the_store_only_without_a_kept_page(written, store_url, tmp_path, monkeypatch):
    """``/kubetune/ready`` (the chart's readiness probe) answers 503 while the warm-up reads
    the store, and 200 at once when every study's page is kept on disk."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(detail_module, "KEEP_SECONDS", 0.05)
    first = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)),
                     snapshots=Snapshots(cache, store_url, 1 << 30))
    assert first.kubetune_details.warmed.wait(60) and get(first, "/kubetune/ready") == ("200 OK", "ready\n")
    wait_for_kept(cache)
    first.kubetune_details.stop()
    reading, release = threading.Event(), threading.Event()
    make_parts = detail_module.StudyDetails._parts

    def slow_parts(self, study_id):   # the warm-up's read of the store, held until released
        reading.set()
        assert release.wait(60)
        return make_parts(self, study_id)
    monkeypatch.setattr(detail_module.StudyDetails, "_parts", slow_parts)
    apps = []
    try:
        for kept in (cache, tmp_path / "empty"):
            reading.clear()
            app = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)),
                           snapshots=Snapshots(kept, store_url, 1 << 30))
            apps.append(app)
            assert reading.wait(60) and not app.kubetune_details.warmed.is_set()
            status = get(app, "/kubetune/ready")[0]
            app.kubetune_details.stop()   # after this warm-up
            assert status.startswith("200" if kept == cache else "503"), (kept, status)
    finally:
        release.set()
        for app in apps:   # their warm-ups end before the store goes
            assert app.kubetune_details.warmed.wait(60)
    assert get(apps[1], "/kubetune/ready")[0].startswith("200")


def get(app, path: str) -> tuple[str, str]:
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], body.decode()


def test_a_cache_dir_that_cannot_be_written_costs_only_the_kept_pages(written, store_url, tmp_path, caplog,
                                                                     monkeypatch):
    """Keeping a page fails (here the directory is a file): logged, and every study's page
    is still made and kept in memory."""
    written.write(Batch(experiments=[ExperimentRow("single-uid", "team-a", "single", "loss", "min", "Running", 200.0,
                                                   study_json([("loss", "min")], [Constraint("memory", max=2.0)],
                                                              {}))],
                        trials=[TrialRow("s-0", "single-uid", "single-0", 0, {"x": 1}, "Succeeded")],
                        results=[ResultRow("s-0", 0, 1, {"loss": 3.0}, time=2000.0)]))
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    monkeypatch.setattr(detail_module, "KEEP_SECONDS", 0.05)
    app = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)),
                   snapshots=Snapshots(blocked, store_url, 1 << 30))
    studies = (study_id_of("exp-uid"), study_id_of("single-uid"))
    wait_for(lambda: all(f"cannot keep study {s}'s page" in caplog.text for s in studies),   # the keeper went on
             timeout=60, interval=0.05, message="the keeper to log each study it could not keep")
    app.kubetune_details.stop()
    for study_id in studies:
        assert app.kubetune_details._pieces[study_id].parts is not None


def test_the_kept_pages_key_is_the_state_its_trials_were_made_from(written, store_url, monkeypatch):
    """``kept_key`` names the store's state the trials were made from, as ``state_key``
    reads it later; a refresh that failed half-way (the results read after the counts)
    leaves it at the old state, so a page made from the old trials is never kept as the
    new, and the next refresh reads the changed trial again (it was lost before)."""
    monkeypatch.setattr(storage_module, "TRIALS_TTL_SECONDS", 0.0)
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    multi = study_id_of("exp-uid")
    trials = storage.get_all_trials(multi, deepcopy=False)
    before = storage.kept_key(multi, trials)
    assert before == storage.state_key(multi)
    written.write(Batch(results=reports(3, [{"loss": 0.4, "size": 9, "memory": 0.5}], start=1)))

    def store_away(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError("SELECT", {}, Exception("the store went away"))
    compact = storage.store.compact_curves   # the results' read (results/curves.py rows)
    monkeypatch.setattr(storage.store, "compact_curves", store_away)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        storage.get_all_trials(multi, deepcopy=False)
    assert storage.kept_key(multi, trials) == before != storage.state_key(multi)
    monkeypatch.setattr(storage.store, "compact_curves", compact)   # back: the refresh goes through
    now = storage.get_all_trials(multi, deepcopy=False)
    assert storage.kept_key(multi, trials) is None        # not the storage's trials any more
    assert storage.kept_key(multi, now) == storage.state_key(multi) != before
    assert now[3].intermediate_values == {1: 0.5, 2: 0.4}


def test_a_study_is_kept_once_unchanged_for_a_round_not_while_it_changes(written, store_url, tmp_path, monkeypatch):
    """The keeper writes a study's page when its state stayed the same since its last
    round: a running Experiment's is not rewritten each round."""
    monkeypatch.setattr(storage_module, "TRIALS_TTL_SECONDS", 0.0)
    monkeypatch.setattr(detail_module, "STALE_LIMIT_SECONDS", 0.0)   # each body() reads the store
    cache, multi = tmp_path / "cache", study_id_of("exp-uid")
    app = make_app(ResultsStoreStorage(open_store(store_url, read_only=True)), warm=False,
                   snapshots=Snapshots(cache, store_url, 1 << 30))
    details = app.kubetune_details

    def keeper_round() -> list:   # what the keeper does each round, for this study
        details.body(multi, 0)
        details._save(multi, details._pieces[multi])
        return sorted(p.stat().st_mtime_ns for p in cache.glob("*.study"))

    assert keeper_round() == []                  # first seen
    kept = keeper_round()                        # unchanged since: kept
    assert len(kept) == 1
    assert keeper_round() == kept                # already kept: not written again
    for step in range(2):                        # a result each round: not written
        written.write(Batch(results=reports(3, [{"loss": 0.4, "size": 9, "memory": 0.5}], start=1 + step)))
        dashboard_compat.app_cache(app).clear()
        assert keeper_round() == kept
    assert keeper_round() != kept                # unchanged for a round again: the new state kept


def wait_for_kept(cache) -> None:
    wait_for(lambda: list(cache.glob("*.study")), timeout=60, interval=0.05, message="a study page kept")


def test_a_page_opened_during_the_warm_up_waits_for_it_and_nothing_counts_for_a_missing_kept_page(
        written, store_url, tmp_path, monkeypatch):
    """A dashboard just started with nothing kept: the warm-up does not count every result
    for the key of a kept page that is not there, and a page opening meanwhile is answered
    with the body the warm-up makes (made once), not a second one made beside it."""
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    keys, makes, asked, release = [], [], threading.Event(), threading.Event()
    monkeypatch.setattr(storage, "state_key", lambda study_id: keys.append(study_id))
    make, parts = detail_module.StudyDetails._make, detail_module.StudyDetails._parts

    def held_make(self, study_id):   # the warm-up's making, held until the page has asked
        makes.append(study_id)
        assert release.wait(60)
        return make(self, study_id)

    def seen_parts(self, study_id, newer_than=None):
        if newer_than is not None:   # the page's request
            asked.set()
        return parts(self, study_id, newer_than)
    monkeypatch.setattr(detail_module.StudyDetails, "_make", held_make)
    monkeypatch.setattr(detail_module.StudyDetails, "_parts", seen_parts)
    app = make_app(storage, snapshots=Snapshots(tmp_path / "nothing-kept", store_url, 1 << 30))
    answer: list = []
    page = threading.Thread(target=lambda: answer.append(api(app, f"/api/studies/{study_id_of('exp-uid')}?after=0")))
    try:
        wait_for(lambda: makes, timeout=60, message="the warm-up to make the body")
        page.start()
        assert asked.wait(60)
    finally:
        release.set()
        page.join(60)
        app.kubetune_details.stop()
    assert app.kubetune_details.warmed.wait(60)
    theirs = optuna_dashboard.wsgi(ResultsStoreStorage(open_store(store_url, read_only=True)))
    assert answer == [api(theirs, f"/api/studies/{study_id_of('exp-uid')}?after=0")]
    assert makes == [study_id_of("exp-uid")] and keys == []
