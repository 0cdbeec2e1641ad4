"""Warm start with ``search.algorithm: cmaes`` uses Optuna's warm-starting CMA-ES
(``CmaEsSampler(source_trials=...)``): CMA-ES reads only the trials of its own
generations, so earlier trials merely added to the study never moved it (its first
generation stayed centred on the middle of the space). Driven through the real runner
in simulated time."""
import math

from kubetune.core.search import WS_CMA_MIN_TRIALS, Searcher, warm_trials
from kubetune.core.simulate import Simulator
from kubetune.spec import parse_experiment
from unit_helpers import BASE, make_runner, merge, records_of

SPACE = {"x": {"uniform": [-5, 10]}, "y": {"uniform": [0, 15]}}
OPTIMUM = (8.0, 12.0)     # far from the middle of the space (2.5, 7.5)


def bowl(params, iteration):
    return (params["x"] - OPTIMUM[0]) ** 2 + (params["y"] - OPTIMUM[1]) ** 2


def spec(algorithm, trials, warm):
    raw = merge(BASE, {"searchSpace": SPACE, "search": {"algorithm": algorithm, "seed": 5},
                       "budget": {"maxTrials": trials, "parallelism": 1}})
    if warm:
        raw["warmStart"] = {"experiments": ["first"]}
    return parse_experiment(raw)


def first_generation_distance(warm_start) -> float:
    """Mean distance to the optimum of the first 6 proposals (CMA-ES's population here)."""
    runner = make_runner(spec("cmaes", 6, bool(warm_start)), name="second", warm_start=warm_start)
    Simulator(runner, bowl, trial_length=1).run()
    return sum(math.dist((t.params["x"], t.params["y"]), OPTIMUM) for t in runner.trials.values()) / 6


def test_cmaes_starts_where_the_earlier_trials_were_good():
    first = make_runner(spec("tpe", 30, False), name="first")
    Simulator(first, bowl, trial_length=1).run()
    warm = warm_trials("first", records_of(first))
    best = min(math.dist((w.params["x"], w.params["y"]), OPTIMUM) for w in warm)
    cold = first_generation_distance(())
    warmed = first_generation_distance(warm)
    assert cold > 4 and warmed < cold / 2, (cold, warmed, best)


def test_fewer_than_ten_earlier_trials_leave_cmaes_as_it_was():
    first = make_runner(spec("tpe", WS_CMA_MIN_TRIALS - 1, False), name="first")
    Simulator(first, bowl, trial_length=1).run()
    searcher = Searcher(spec("cmaes", 6, True), warm_start=warm_trials("first", records_of(first)))
    assert searcher.warm_start_used == WS_CMA_MIN_TRIALS - 1
    assert searcher.study.sampler._source_trials is None
    assert searcher.suggest("second-0") is not None      # no error from the cmaes package
