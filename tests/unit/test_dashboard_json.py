"""The study-detail body kubetune serves (dashboard/detail.py, trial_json.py,
study_extras.py) against optuna-dashboard's own view over an Optuna RDBStorage
(SQLite) holding the same trials: the parsed JSON must be equal, for every
``after`` the page sends.  The trials cover what the fast paths special-case:
NaN and infinite intermediate values, steps reported out of order, floats that
orjson and Python write differently (1e-05), an infinite constraint (a metric never
reported: written by json.dumps, as optuna-dashboard writes it), every trial state,
numeric and text user attributes, a parameter only some trials have (union vs
intersection), and many trials of one kind (study_extras folds only two of them)."""
from __future__ import annotations

import copy
import json
import math
import pickle
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from kubetune.dashboard import dashboard_compat as odc
from kubetune.dashboard.packed_trial import PackedCurveTrial, plain_copy
from kubetune.dashboard.server import make_app
from kubetune.dashboard.storage import ResultsStoreStorage
from kubetune.dashboard.study_extras import deciding_trials, extra_study_property
from kubetune.results import Batch, ExperimentRow, ResultRow, TrialRow, open_store
from kubetune.results.study_meta import study_json
from kubetune.spec.model import Constraint

MULTI = study_json([("loss", "min"), ("size", "max")], [Constraint("memory", max=2.0)],
                   {"lr": FloatDistribution(1e-5, 1e-1, log=True), "opt": CategoricalDistribution(["adam", "sgd", "rms"]),
                    "layers": IntDistribution(1, 8)})
COLOURS = ["red", "orange", "yellow", "green", "blue", "indigo", "violet", "black"]   # list(set()) reorders them
SINGLE = study_json([("acc", "max")], [], {"x": FloatDistribution(0.0, 1.0), "colour": CategoricalDistribution(COLOURS)})
PHASES = ["Succeeded", "Succeeded", "Stopped", "Failed", "Running", "Succeeded", "Paused", "Succeeded"]


def multi_trials() -> tuple[list[TrialRow], list[ResultRow]]:
    trials, results = [], []
    for i in range(40):
        phase = PHASES[i % len(PHASES)]
        params = {"lr": 10 ** -(1 + (i % 4)), "opt": ["adam", "sgd", "rms"][i % 3]}
        if i % 5:   # a parameter only some trials have
            params["layers"] = 1 + i % 8
        trials.append(TrialRow(f"m-{i}", "multi-uid", f"multi-{i}", i, params, phase,
                               reason="OOMKilled" if phase == "Failed" else "", attempt=i % 3))
        steps = [3, 1, 2] if i % 7 == 0 else [1, 2, 3]   # out of order now and then
        for seq, step in enumerate(steps):
            loss = [1e-5 * (i + 1), 2.5 + i, 1e16 / (i + 1)][seq]
            if i % 9 == 4 and seq == 1:
                loss = math.nan
            if i % 11 == 3 and seq == 2:
                loss = -math.inf
            metrics = {"loss": loss, "size": float(i % 6), "memory": 0.5 * (i % 6)}
            if i % 13 == 12 and seq == 2:
                del metrics["memory"]   # never reported last: the constraint is infinite
            results.append(ResultRow(f"m-{i}", seq, step, metrics, time=1.7e9 + i + seq / 8))
    trials.append(TrialRow("m-pending", "multi-uid", "multi-pending", 40, {"lr": 0.01, "opt": "adam"}, "Pending"))
    return trials, results


def single_trials() -> tuple[list[TrialRow], list[ResultRow]]:
    trials = [TrialRow(f"s-{i}", "single-uid", f"single-{i}", i, {"x": i / 10, "colour": COLOURS[i]},
                       "Stopped" if i == 2 else "Succeeded") for i in range(5)]   # all of one kind
    results = [ResultRow(f"s-{i}", seq, seq, {"acc": 0.1 * i + seq / 100}, time=1.8e9 + i + seq)
               for i in range(5) for seq in range(4)]
    return trials, results


@pytest.fixture
def stores(tmp_path):
    """kubetune's results store and an Optuna RDBStorage holding the same studies."""
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    (mt, mr), (st, sr) = multi_trials(), single_trials()
    store.write(Batch(experiments=[ExperimentRow("multi-uid", "team", "multi", "loss", "min", "Running", 100.0, MULTI),
                                   ExperimentRow("single-uid", "team", "single", "acc", "max", "Succeeded", 200.0,
                                                 SINGLE)],
                      trials=mt + st))
    for seq in range(4):   # a batch per result of each trial: the rows' points JSON is appended to (curves.py)
        store.write(Batch(results=[r for r in mr + sr if r.seq == seq]))
    ours = ResultsStoreStorage(open_store(f"sqlite:///{tmp_path / 'results.db'}", read_only=True))
    rdb = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    ids = {}
    for frozen in ours.get_all_studies():
        study = optuna.create_study(storage=rdb, study_name=frozen.study_name, directions=frozen.directions)
        for key, value in frozen.user_attrs.items():
            study.set_user_attr(key, value)
        for key, value in frozen.system_attrs.items():
            rdb.set_study_system_attr(study._study_id, key, value)
        study.add_trials(copy.deepcopy(ours.get_all_trials(frozen._study_id)))
        ids[frozen._study_id] = study._study_id
    yield ours, rdb, ids
    store.close()
    ours.store.close()


def body(app, study_id: int, after: int) -> dict:
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=f"/api/studies/{study_id}", QUERY_STRING=f"after={after}")
    status: list[str] = []
    raw = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), raw[:500]
    return json.loads(raw)


def comparable(served: dict) -> dict:
    """The body without what is the storage's own: its IDs (RDBStorage numbers them its
    way) and the order of user attributes (RDBStorage hands them sorted by key)."""
    for trial in served["trials"] + served["best_trials"]:
        del trial["trial_id"], trial["study_id"]
        trial["user_attrs"].sort(key=lambda attr: attr["key"])
    served["union_user_attrs"].sort(key=lambda attr: attr["key"])
    return served


@pytest.mark.parametrize("after", [0, 4, 40, 41])
def test_the_served_body_is_optuna_dashboards_over_an_rdb_storage(stores, after):
    ours, rdb, ids = stores
    app, theirs = make_app(ours, warm=False), optuna_dashboard.wsgi(rdb)
    for study_id, rdb_id in ids.items():
        served = comparable(body(app, study_id, after))
        expected = comparable(body(theirs, rdb_id, after))
        assert served == expected
    multi = next(s for s, r in ids.items() if r == 1)
    served = body(app, multi, 0)
    assert len(served["trials"]) == 41 and served["best_trials"] and served["has_intermediate_values"]
    assert {t["state"] for t in served["trials"]} == {"Complete", "Pruned", "Fail", "Running", "Waiting"}
    assert [p["name"] for p in served["union_search_space"]] == ["layers", "lr", "opt"]
    assert [p["name"] for p in served["intersection_search_space"]] == ["lr", "opt"]


def test_the_body_is_written_by_both_encoders_where_each_applies(stores):
    """orjson for a trial (compact, its own float text), json.dumps for one whose
    constraint is infinite (``Infinity``, as optuna-dashboard writes it)."""
    ours, _, ids = stores
    multi = next(s for s, r in ids.items() if r == 1)
    raw = make_app(ours, warm=False).kubetune_details.body(multi, 0)
    assert b'{"step":3,"value":0.00001}' in raw                 # orjson's text of 1e-05
    assert b'"constraints": [Infinity]' in raw                  # json.dumps', for the trial it must write
    assert b'"value":"nan"' in raw and b'"value":"-inf"' in raw


def test_study_extras_fold_two_trials_of_each_kind_and_answer_as_all(stores):
    ours, _, ids = stores
    for study_id in ids:
        trials = ours.get_all_trials(study_id, deepcopy=False)
        everything = odc.get_cached_extra_study_property(odc.InMemoryCache(), study_id, trials)
        assert extra_study_property(study_id, trials) == everything
    multi = next(s for s, r in ids.items() if r == 1)
    trials = ours.get_all_trials(multi, deepcopy=False)
    assert len(deciding_trials(trials)) < len(trials) / 2
    copies = [copy.deepcopy(t) for t in trials]   # equal distributions, other objects (as after a refresh)
    assert deciding_trials(copies) == [t for t in copies if t.number in {k.number for k in deciding_trials(trials)}]
    copies[-1].distributions["lr"] = FloatDistribution(1e-6, 1.0, log=True)   # another for one name: fold all
    assert deciding_trials(copies) == copies
    assert extra_study_property(multi, copies) == odc.get_cached_extra_study_property(odc.InMemoryCache(), multi,
                                                                                       copies)


def test_a_trial_with_packed_points_is_a_frozen_trial_to_whoever_looks(stores):
    """The storage hands trials whose intermediate values stay packed (packed_trial.py):
    the body is made without their dicts, and a copy, pickle, comparison or repr sees a
    plain FrozenTrial with them."""
    ours, _, ids = stores
    multi = next(s for s, r in ids.items() if r == 1)
    ours = ResultsStoreStorage(open_store(ours.store.url, read_only=True))   # nothing asked of it yet
    make_app(ours, warm=False).kubetune_details.body(multi, 0)
    trials = ours.get_all_trials(multi, deepcopy=False)
    packed = [t for t in trials if isinstance(t, PackedCurveTrial)]
    # made only for what needs them: the few trials the search spaces fold, points the row's JSON cannot hold
    untouched = [t for t in packed if vars(t)["intermediate_values"] is None]
    assert len(packed) == 40 and len(untouched) >= 25
    trial = untouched[0]
    i = trial.number
    plain = plain_copy(trial)
    assert type(plain) is optuna.trial.FrozenTrial and plain.intermediate_values == {1: 1e-5 * (i + 1), 2: 2.5 + i,
                                                                                     3: 1e16 / (i + 1)}
    for seen in (copy.deepcopy(trial), pickle.loads(pickle.dumps(trial)), copy.copy(trial)):
        assert seen == trial == plain and plain == seen and seen.intermediate_values == plain.intermediate_values
    assert repr(trial) == repr(plain).replace("FrozenTrial(", "PackedCurveTrial(", 1)
    assert all(vars(t)["intermediate_values"] is None for t in untouched)   # copies made theirs, not its
    assert trial.last_step == 3 and vars(trial)["intermediate_values"] == plain.intermediate_values   # made when asked
    ours.store.close()
