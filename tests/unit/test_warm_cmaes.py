"""Warm start with ``search.algorithm: cmaes`` uses Optuna's warm-starting CMA-ES
(``CmaEsSampler(source_trials=...)``): CMA-ES reads only the trials of its own
generations, so earlier trials merely added to the study never moved it (its first
generation stayed centred on the middle of the space). Driven through the real runner
in simulated time."""
import math

from kubetune.core.search import WS_CMA_MIN_TRIALS, Searcher
from kubetune.core.warm_trials import warm_trials
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


def mixed_spec(algorithm, trials, warm, space, warm_space="full"):
    raw = merge(BASE, {"searchSpace": space, "search": {"algorithm": algorithm, "seed": 5},
                       "budget": {"maxTrials": trials, "parallelism": 1}})
    if warm:
        raw["warmStart"] = {"experiments": ["first"], "searchSpace": warm_space}
    return parse_experiment(raw)


def warm_cmaes_run(space, warm_space, first_loss, first_trials=30):
    """The earlier Experiment (TPE) then a warm CMA-ES Experiment: every
    second-Experiment trial it runs, and the CMA-ES sampler's source trials."""
    first = make_runner(mixed_spec("tpe", first_trials, False, space), name="first")
    Simulator(first, first_loss, trial_length=1).run()
    second = make_runner(mixed_spec("cmaes", 8, True, space, warm_space), name="second",
                         warm_start=warm_trials("first", records_of(first)))
    Simulator(second, first_loss, trial_length=1).run()
    return second


def test_warm_cmaes_with_a_choice_parameter_runs_its_trials():
    # CMA-ES leaves a choice out of its search space; source trials carrying it were
    # refused ("No compatible source_trials") on every ask, so no trial ever started.
    space = {**SPACE, "opt": {"choice": ["adam", "sgd"]}}
    second = warm_cmaes_run(space, "full", lambda p, i: bowl(p, i) + (p["opt"] == "adam"))
    done = [t for t in second.trials.values() if t.phase.value == "Succeeded"]
    assert len(done) == 8
    assert {t.params["opt"] for t in done} <= {"adam", "sgd"}
    assert set(second.searcher.study.sampler._source_trials[0].params) == {"x", "y"}


def test_warm_cmaes_with_a_box_that_collapses_an_int_runs_its_trials():
    # every good earlier trial took n=3, so the bounding box makes n a single value,
    # which CMA-ES leaves out of its search space as it does a choice; 100 earlier
    # trials give 10 good ones, all inside the box, enough for warm CMA-ES
    space = {**SPACE, "n": {"randint": [1, 9]}}
    second = warm_cmaes_run(space, "boundingBox", lambda p, i: bowl(p, i) + 100 * (p["n"] != 3), 100)
    assert second.searcher.distributions["n"].single()
    assert set(second.searcher.study.sampler._source_trials[0].params) == {"x", "y"}
    done = [t for t in second.trials.values() if t.phase.value == "Succeeded"]
    assert len(done) == 8 and {t.params["n"] for t in done} == {3}
