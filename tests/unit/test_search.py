"""The Optuna-backed Searcher: every algorithm, grids, seeds, and rebuilds without repeats."""
import importlib.util
import math
import random

import optuna
import pytest

from kubetune.core.samplers import missing_packages
from kubetune.core.search import Searcher
from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.spec import SpecError, parse_experiment

SPACE = {
    "lr": {"loguniform": [1e-4, 1e-1]},
    "x": {"uniform": [-1, 1]},
    "layers": {"randint": [1, 4]},
    "width": {"quniform": [8, 64, 8]},
    "act": {"choice": ["relu", "tanh", True]},
}
GRID_SPACE = {"layers": {"randint": [1, 4]}, "width": {"quniform": [8, 32, 8]}, "act": {"choice": ["relu", "tanh"]}}


def make(algorithm, space=SPACE, seed=3, mode="min"):
    return parse_experiment({"objective": {"metric": "loss", "mode": mode}, "searchSpace": space,
                             "search": {"algorithm": algorithm, "seed": seed}, "trial": {"entrypoint": "a:b"}})


def available(algorithm):
    return pytest.param(algorithm, marks=pytest.mark.skipif(
        bool(missing_packages(algorithm)), reason=f"{algorithm} needs {missing_packages(algorithm)}"))


def in_space(params):
    return (1e-4 <= params["lr"] <= 1e-1 and -1 <= params["x"] <= 1 and params["layers"] in (1, 2, 3)
            and params["width"] in range(8, 65, 8) and isinstance(params["width"], int)
            and params["act"] in ("relu", "tanh", True))


@pytest.mark.parametrize("algorithm", ["random", "tpe", available("cmaes"), available("qmc"), available("gp")])
def test_every_algorithm_suggests_values_inside_the_space(algorithm):
    searcher = Searcher(make(algorithm))
    for i in range(14):
        params = searcher.suggest(f"t-{i}")
        assert in_space(params), params
        searcher.report_intermediate(f"t-{i}", 1, params["x"] ** 2)
        searcher.complete(f"t-{i}", params["x"] ** 2 + params["lr"], TrialPhase.SUCCEEDED)
    assert len(searcher.study.trials) == 14


@pytest.mark.parametrize("algorithm,packages", [("cmaes", ["cmaes"]), ("gp", ["torch", "scipy"]), ("qmc", ["scipy"])])
def test_missing_optional_package_is_a_spec_error_naming_the_fix(algorithm, packages, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in packages else real(name, *a))
    with pytest.raises(SpecError) as caught:
        Searcher(make(algorithm))
    assert caught.value.path == "spec.search.algorithm"
    assert all(p in caught.value.message for p in packages) and "tpe" in caught.value.message


def test_same_seed_same_parameters():
    def first_five(seed):
        searcher = Searcher(make("tpe", seed=seed))
        return [searcher.suggest(f"t-{i}") for i in range(5)]
    assert first_five(11) == first_five(11)
    assert first_five(11) != first_five(12)


def test_grid_covers_every_point_once_then_is_exhausted():
    searcher = Searcher(make("grid", GRID_SPACE))
    assert searcher.grid_size == 3 * 4 * 2
    seen = []
    for i in range(24):
        params = searcher.suggest(f"g-{i}")
        seen.append(tuple(sorted(params.items(), key=lambda kv: kv[0])))
    assert len(set(seen)) == 24
    assert searcher.exhausted and searcher.suggest("g-24") is None
    for i in range(24):           # finishing the last grid trials must not try to stop a loop
        searcher.complete(f"g-{i}", float(i), TrialPhase.SUCCEEDED)


def test_tpe_uses_constant_liar_so_parallel_asks_spread_out():
    searcher = Searcher(make("tpe", {"x": {"uniform": [-5, 5]}}))
    sampler = searcher.study.sampler
    assert isinstance(sampler, optuna.samplers.TPESampler) and sampler._constant_liar
    for i in range(15):
        params = searcher.suggest(f"t-{i}")
        searcher.complete(f"t-{i}", (params["x"] - 1) ** 2, TrialPhase.SUCCEEDED)
    pending = [searcher.suggest(f"p-{i}")["x"] for i in range(8)]      # 8 trials in flight at once
    gaps = [abs(a - b) for i, a in enumerate(pending) for b in pending[i + 1:]]
    assert min(gaps) > 1e-3


def record(name, index, params, phase, losses=(), reason=""):
    history = tuple({"loss": v, "iteration": i + 1} for i, v in enumerate(losses))
    return TrialRecord(name=name, index=index, params=params, phase=phase, history=history, reason=reason)


@pytest.mark.parametrize("algorithm", ["random", "tpe", available("qmc")])
def test_rebuild_continues_without_repeating_parameters(algorithm):
    original = Searcher(make(algorithm))
    records = []
    for i in range(12):
        params = original.suggest(f"e-{i}")
        phase = TrialPhase.RUNNING if i >= 10 else TrialPhase.SUCCEEDED
        records.append(record(f"e-{i}", i, params, phase, [params["x"] ** 2]))
    rebuilt = Searcher(make(algorithm))
    rebuilt.rebuild(records)
    study = rebuilt.study
    assert [t.state for t in study.trials].count(optuna.trial.TrialState.RUNNING) == 2
    assert study.trials[3].value == records[3].history[0]["loss"]
    old = {tuple(sorted((k, str(v)) for k, v in r.params.items())) for r in records}
    for i in range(12, 30):
        params = rebuilt.suggest(f"e-{i}")
        assert in_space(params)
        assert tuple(sorted((k, str(v)) for k, v in params.items())) not in old
    # A restored running trial still takes reports and completes.
    rebuilt.report_intermediate("e-10", 2, 0.5)
    rebuilt.complete("e-10", 0.5, TrialPhase.SUCCEEDED)
    assert study.trials[10].state == optuna.trial.TrialState.COMPLETE and study.trials[10].value == 0.5


def test_rebuild_grid_resumes_with_the_remaining_points_and_fills_index_gaps():
    original = Searcher(make("grid", GRID_SPACE))
    handed_out = [original.suggest(f"g-{i}") for i in range(10)]
    records = [record(f"g-{i}", i, p, TrialPhase.SUCCEEDED, [1.0]) for i, p in enumerate(handed_out) if i != 4]
    rebuilt = Searcher(make("grid", GRID_SPACE))
    rebuilt.rebuild(records)       # index 4's Trial resource is gone: its number stays taken
    assert len(rebuilt.study.trials) == 10
    rest = [rebuilt.suggest(f"g-{i}") for i in range(10, 24)]
    assert rebuilt.suggest("g-24") is None
    every = handed_out + rest
    assert len({tuple(sorted(p.items(), key=lambda kv: kv[0])) for p in every}) == 24


def test_stopped_and_failed_trials_inform_the_study_as_pruned_and_failed():
    searcher = Searcher(make("random"))
    for name, phase in (("a", TrialPhase.STOPPED), ("b", TrialPhase.FAILED), ("c", TrialPhase.SUCCEEDED)):
        searcher.suggest(name)
        searcher.report_intermediate(name, 1, 0.3)
        searcher.report_intermediate(name, 1, 0.9)     # a retry reporting iteration 1 again: first kept
        searcher.complete(name, None if name != "c" else math.nan, phase)
    states = [t.state for t in searcher.study.trials]
    assert states == [optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED]
    assert searcher.study.trials[0].intermediate_values == {1: 0.3}


def test_resample_stays_in_the_space():
    searcher = Searcher(make("random"))
    rng = random.Random(0)
    for _ in range(50):
        params = {name: searcher.resample(name, rng) for name in SPACE}
        assert in_space(params)
