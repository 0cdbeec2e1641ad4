"""``ordinal``: increasing numbers sampled in their order (Katib's ``discrete``), where a
``choice`` is unordered and CMA-ES/GP do not search it at all (the search-quality
benchmark's HPOBench tables: kubetune cmaes was random search there)."""
import random

import optuna
import pytest

from kubetune.core.samplers import from_study, shown_distribution
from kubetune.core.schedulers.pbt import perturb
from kubetune.core.search import Searcher
from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.core.warm_box import _narrow
from kubetune.spec import SpecError, parse_experiment

WIDTHS = [16, 32, 64, 128, 256, 512]
SPACE = {"width": {"ordinal": WIDTHS}, "depth": {"ordinal": [1, 2, 3]}, "dropout": {"ordinal": [0.0, 0.3, 0.6]}}


def make(algorithm="cmaes", space=SPACE, **search):
    return parse_experiment({"objective": {"metric": "loss", "mode": "min"}, "searchSpace": space,
                             "search": {"algorithm": algorithm, "seed": 5, **search}, "trial": {"entrypoint": "a:b"}})


def loss(params):
    return abs(params["width"] - 128) / 128 + params["depth"] + params["dropout"]


def test_an_ordinal_is_its_listed_numbers_which_the_samplers_see_by_position():
    width = make().search_space["width"]
    assert width.choices == tuple(WIDTHS) and (width.low, width.high) == (16, 512)
    assert width.contains(64) and width.contains(64.0) and not width.contains(65) and not width.contains(True)
    dist = Searcher(make("random")).distributions["width"]
    assert dist == optuna.distributions.IntDistribution(0, len(WIDTHS) - 1)
    # what the dashboard shows: the values trials ran
    assert shown_distribution(width) == optuna.distributions.CategoricalDistribution(WIDTHS)


@pytest.mark.parametrize("values,words", [
    ([32, 16], "values must increase (got 32 then 16)"),
    ([16, 16, 32], "values must increase"),
    (["small", "large"], "for unordered values use choice"),
    ([True, False], "for unordered values use choice"),
    ([16], "at least 2 increasing numbers"),
    ("16,32", "at least 2 increasing numbers"),
])
def test_a_bad_ordinal_is_refused_naming_the_field_and_the_fix(values, words):
    with pytest.raises(SpecError) as caught:
        make(space={"width": {"ordinal": values}})
    assert caught.value.path == "spec.searchSpace.width.ordinal" and words in caught.value.message


def test_an_initial_point_off_the_list_is_refused():
    with pytest.raises(SpecError) as caught:
        make(initialPoints=[{"width": 100, "depth": 1, "dropout": 0.0}])
    assert caught.value.path == "spec.search.initialPoints[0].width" and "one of [16, 32" in caught.value.message


def test_cmaes_searches_an_ordinal_space_itself_and_runs_only_listed_values():
    searcher = Searcher(make("cmaes"))
    for i in range(40):
        params = searcher.suggest(f"t-{i}")
        assert params["width"] in WIDTHS and isinstance(params["width"], int), params
        assert params["depth"] in (1, 2, 3) and params["dropout"] in (0.0, 0.3, 0.6)
        assert searcher.study.trials[-1].params["width"] == WIDTHS.index(params["width"])
        searcher.complete(f"t-{i}", loss(params), TrialPhase.SUCCEEDED, params=params)
    study, trial = searcher.study, searcher.study.trials[-1]
    # CMA-ES's own space (not its random fallback, which a choice space gets)
    assert set(study.sampler.infer_relative_search_space(study, trial)) == set(SPACE)
    # and it moves towards the optimum (width 128, depth 1, dropout 0: loss 1), where its
    # random start does not stay
    assert sum(t.value for t in study.trials[-10:]) < sum(t.value for t in study.trials[:10])


def test_a_rebuilt_study_holds_the_values_that_ran():
    original = Searcher(make("tpe"))
    records = []
    for i in range(12):
        params = original.suggest(f"e-{i}")
        records.append(TrialRecord(name=f"e-{i}", index=i, params=params, phase=TrialPhase.SUCCEEDED,
                                   history=({"loss": loss(params), "iteration": 1},)))
        original.complete(f"e-{i}", loss(params), TrialPhase.SUCCEEDED, params=params)
    rebuilt = Searcher(make("tpe"))
    rebuilt.rebuild(records)
    assert [t.params for t in rebuilt.study.trials] == [t.params for t in original.study.trials]
    assert [r.params for r in records] == [from_study(original.space, t.params) for t in original.study.trials]
    assert rebuilt.suggest("e-12") == original.suggest("e-12")     # a restart suggests the same


def test_pbt_and_the_warm_start_box_keep_an_ordinal_on_its_list():
    width = make().search_space["width"]
    assert perturb(width, 64, random.Random(1)) in (32, 128)
    narrowed = _narrow(width, [32, 128])
    assert narrowed.choices == (32, 64, 128) and (narrowed.low, narrowed.high) == (32, 128)


def test_a_warm_trials_float_of_a_listed_integer_counts_as_that_configuration_evaluated():
    # an earlier Experiment's results may hold 32.0 where this list has 32: the search must
    # know the configuration as evaluated (config_key tells 32 from 32.0), not run it again
    from kubetune.core.search_values import config_key
    from kubetune.core.warm_trials import WarmTrial, usable_warm_trials
    spec = make("tpe", space={"width": {"ordinal": WIDTHS}})
    distributions = {"width": None}
    (usable,), problems = usable_warm_trials(spec, distributions, [WarmTrial("old/t-0", {"width": 32.0}, {"loss": 1.0})])
    assert problems == [] and type(usable.params["width"]) is int
    assert config_key(usable.params, distributions) == config_key({"width": 32}, distributions)


def test_the_size_limit_counts_each_ordinal_value():
    from kubetune.spec.search_space import search_space_size
    assert search_space_size({"w": {"ordinal": [16, 32, 64]}}) == (1 + 32) + 3 * 8
    big = {f"p{i:02d}": {"ordinal": list(range(256))} for i in range(64)}     # 64 x 256: over 128 KiB
    with pytest.raises(SpecError, match=r"spec.searchSpace: is too large"):
        make(space=big)
