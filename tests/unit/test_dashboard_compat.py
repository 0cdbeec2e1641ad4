"""optuna-dashboard's private names, used through dashboard/dashboard_compat.py only: each
is called here as kubetune.dashboard.detail calls it, over Optuna's in-memory storage,
so an upgrade that moves or changes one fails this file, by name.  (That the assembled
body equals the dashboard's own view is tests/integration/test_dashboard_storage.py.)"""
from __future__ import annotations

import json
import math
import pathlib
import re

import optuna
import optuna_dashboard
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

import kubetune
from kubetune.dashboard import dashboard_compat as odc
from kubetune.dashboard.trial_json import trial_json


def study_with_trials() -> optuna.Study:
    study = optuna.create_study(directions=["minimize", "maximize"])
    for x, values in ((0.1, [1.0, 1.0]), (0.2, [0.5, 2.0]), (0.3, [2.0, 0.5])):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions={"x": FloatDistribution(0, 1)},
                                                  values=values, intermediate_values={1: 3.0, 2: x},
                                                  state=TrialState.COMPLETE))
    return study


def test_each_name_works_as_detail_calls_it():
    study = study_with_trials()
    storage = study._storage
    app = optuna_dashboard.wsgi(storage)
    cache = odc.app_cache(app)
    frozen = odc.get_study(storage, study._study_id)
    assert frozen is not None and frozen.study_name == study.study_name
    trials = odc.get_trials(cache, storage, study._study_id)
    assert [t.number for t in trials] == [0, 1, 2]
    front = odc.get_pareto_front_trials(trials=trials, directions=frozen.directions)
    assert [t.number for t in front] == [1]
    intersection, union, user_attrs, has_intermediate = odc.get_cached_extra_study_property(
        odc.InMemoryCache(), study._study_id, trials)
    assert [name for name, _ in intersection] == ["x"] and has_intermediate
    rest = odc.serialize_study_detail(frozen, [], [], intersection, union, user_attrs, has_intermediate, {}, [])
    assert rest["trials"] == [] and rest["directions"] == ["minimize", "maximize"]
    piece = json.loads(json.dumps(odc.serialize_frozen_trial(study._study_id, trials[1], frozen.system_attrs)))
    assert piece["number"] == 1 and piece["values"] == [0.5, 2.0]
    assert piece["intermediate_values"] == [{"step": 1, "value": 3.0}, {"step": 2, "value": 0.2}]


def test_no_other_module_imports_optuna_dashboards_private_names():
    root = pathlib.Path(kubetune.__file__).parent
    private = re.compile(r"^\s*(from|import)\s+optuna_dashboard\.(_\w+|\w+\._)", re.M)
    users = {str(p.relative_to(root)) for p in root.rglob("*.py") if private.search(p.read_text())}
    assert users == {"dashboard/dashboard_compat.py"}, users


def test_a_trials_json_is_what_optuna_dashboards_serializer_makes():
    """trial_json writes the intermediate values itself (fast): same JSON, with
    NaN and ±Infinity as the dashboard's strings and steps in order."""
    trial = optuna.trial.create_trial(
        params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)}, values=[1.0, 2.0], state=TrialState.COMPLETE,
        intermediate_values={3: 0.1, 1: float("nan"), 2: float("inf"), 4: -float("inf"), 5: 1e-300, 6: 1 / 3},
        user_attrs={"phase": "Succeeded"}, system_attrs={"constraints": [0.5]})
    trial._trial_id = 7
    ours = json.loads(trial_json(1, trial, {}))
    assert ours == json.loads(json.dumps(odc.serialize_frozen_trial(1, trial, {})))
    assert [v["value"] for v in ours["intermediate_values"]] == ["nan", "inf", 0.1, "-inf", 1e-300, 1 / 3]
    assert trial.intermediate_values[1] != trial.intermediate_values[1]   # the trial itself is left as it was


def test_finite_floats_parse_as_json_dumps_writes_them():
    """orjson writes some floats in other words than json.dumps (1e-05 as 0.00001,
    1e+16 as 1e16): the same numbers once parsed, to the last bit."""
    values = {2: 100.0, 0: 3.0, 1: 1e16, 3: 1e-7, 4: -0.0, 5: 2 / 3, 6: 12345678.9, 7: 1e-5, 8: 5e-324, 9: 1.7e308}
    trial = optuna.trial.create_trial(params={}, distributions={}, value=1e-5, intermediate_values=values)
    trial._trial_id = 7
    ours = json.loads(trial_json(1, trial, {}))
    assert ours == json.loads(json.dumps(odc.serialize_frozen_trial(1, trial, {})))
    assert [math.copysign(1, v["value"]) for v in ours["intermediate_values"]][4] == -1.0   # -0.0 kept


def test_what_orjson_would_write_otherwise_is_written_by_json_dumps():
    """A constraint never met (infinite: json.dumps writes Infinity, orjson null) and an
    integer over 64 bits (orjson refuses): word for word what optuna-dashboard writes."""
    for params, distributions, constraints in (({"x": 0.5}, {"x": FloatDistribution(0, 1)}, [math.inf, 0.5]),
                                               ({"n": 1 << 70}, {"n": IntDistribution(0, 1 << 71)}, [0.5])):
        trial = optuna.trial.create_trial(params=params, distributions=distributions, value=1.0,
                                          intermediate_values={1: 2.0}, system_attrs={"constraints": constraints})
        trial._trial_id = 7
        assert trial_json(1, trial, {}).decode() == json.dumps(odc.serialize_frozen_trial(1, trial, {}))
