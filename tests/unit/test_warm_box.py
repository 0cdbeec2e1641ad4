"""warmStart.searchSpace: boundingBox (core/warm_box.py): the warm-started Experiment
searches only the box of the earlier Experiment's best trials, says so in its
WarmStarted condition, and a restarted operator searches the same box with the same
proposals. Driven through the real runner in simulated time; the expected box is
computed here with plain loops."""
import math

import pytest

from kubetune.controller.outcomes_status import warm_start_condition
from kubetune.core.search import Searcher
from kubetune.core.warm_trials import warm_trials
from kubetune.core.simulate import Simulator
from kubetune.core.types import LaunchTrial
from kubetune.spec import SpecError, parse_experiment
from unit_helpers import BASE, make_runner, merge, of_type, records_of

SPACE = {"x": {"uniform": [-5, 10]}, "y": {"uniform": [0, 15]}, "n": {"randint": [1, 9]},
         "opt": {"choice": ["adam", "sgd", "rms"]}}


def loss(params, iteration):
    """A bowl at x=2, y=3, n=4, best with sgd; also reports the memory it needed."""
    penalty = {"adam": 1.0, "sgd": 0.0, "rms": 2.0}[params["opt"]]
    value = (params["x"] - 2) ** 2 + (params["y"] - 3) ** 2 + (params["n"] - 4) ** 2 + penalty
    return {"loss": value, "memory_gb": params["n"] / 2}


def spec(space="boundingBox", trials=40, seed=7, **extra):
    raw = merge(BASE, {"searchSpace": SPACE, "search": {"algorithm": "tpe", "seed": seed},
                       "budget": {"maxTrials": trials, "parallelism": 1}, **extra})
    if space is not None:
        raw["warmStart"] = {"experiments": ["first"], "searchSpace": space}
    return parse_experiment(raw)


@pytest.fixture(scope="module")
def first():
    runner = make_runner(spec(space=None, seed=3), name="first")
    Simulator(runner, loss, trial_length=1).run()
    return runner


def good_trials(runner, count, feasible=lambda t: True):
    done = [t for t in runner.trials.values() if t.phase.value == "Succeeded" and feasible(t)]
    return sorted(done, key=lambda t: (t.last_value, t.index))[:count]


def test_the_spec_field_its_default_and_its_error():
    assert spec(space="full").warm_start.search_space == "full"
    assert parse_experiment(merge(BASE, {"warmStart": {"experiments": ["a"]}})).warm_start.search_space == "full"
    assert spec().warm_start.search_space == "boundingBox"
    with pytest.raises(SpecError) as error:
        spec(space="box")
    assert error.value.path == "spec.warmStart.searchSpace" and "boundingBox" in error.value.message


def test_the_search_stays_in_the_box_of_the_best_tenth_and_says_so(first):
    warm = warm_trials("first", records_of(first))
    good = good_trials(first, math.ceil(len(warm) / 10))     # TPE's "good" set: the best 10%
    low = {p: min(t.params[p] for t in good) for p in ("x", "y", "n")}
    high = {p: max(t.params[p] for t in good) for p in ("x", "y", "n")}
    choices = {t.params["opt"] for t in good}
    second = make_runner(spec(), name="second", warm_start=warm)
    sim = Simulator(second, loss, trial_length=1)
    sim.run()
    launched = [d.params for d in of_type(sim.log, LaunchTrial)]
    assert len(launched) == 40
    for params in launched:
        assert all(low[p] <= params[p] <= high[p] for p in low), params
        assert params["opt"] in choices
    inside = [w for w in warm if all(low[p] <= w.params[p] <= high[p] for p in low) and w.params["opt"] in choices]
    outcomes = second.summary(0).outcomes
    assert outcomes.warm_start_used == len(inside) < len(warm)
    [(_, status, reason, message)] = warm_start_condition(outcomes, True)
    assert status and reason == "Seeded"
    assert f"bounding box of the best {len(good)} earlier trials" in message
    assert f"x in [{low['x']:.6g}, {high['x']:.6g}]" in message and f"n in [{low['n']}, {high['n']}]" in message
    assert f"{len(warm) - len(inside)} earlier trials outside it" in message
    # the full space, same seed: proposals leave that box (what the box changes)
    full = make_runner(spec(space="full"), name="second", warm_start=warm)
    full_sim = Simulator(full, loss, trial_length=1)
    full_sim.run()
    assert any(not low["x"] <= d.params["x"] <= high["x"] for d in of_type(full_sim.log, LaunchTrial))


def test_a_restarted_operator_searches_the_same_box_with_the_same_proposals(first):
    warm = warm_trials("first", records_of(first))
    whole = make_runner(spec(trials=12), name="second", warm_start=warm)
    Simulator(whole, loss, trial_length=1).run()
    before = make_runner(spec(trials=12), name="second", warm_start=warm)
    sim = Simulator(before, loss, trial_length=1)
    while len(before.trials) < 5:
        sim.tick()
    after = make_runner(spec(trials=12), name="second", warm_start=warm)   # the same warm-start set
    after.restore(records_of(before))
    resumed = Simulator(after, loss, trial_length=1)
    resumed.reattach()
    resumed.run()
    assert after.searcher.space == whole.searcher.space != dict(spec().search_space)
    assert [after.trials[f"second-{i}"].params for i in range(12)] == \
           [whole.trials[f"second-{i}"].params for i in range(12)]


def test_infeasible_trials_never_span_the_box(first):
    warm = warm_trials("first", records_of(first))
    limit = {"constraints": [{"metric": "memory_gb", "max": 1.5}]}     # n <= 3
    good = good_trials(first, math.ceil(len(warm) / 10), feasible=lambda t: t.params["n"] <= 3)
    searcher = Searcher(spec(**limit), warm_start=warm)
    assert searcher.space["n"].high - 1 == max(t.params["n"] for t in good) <= 3
    assert searcher.space["x"].low == min(t.params["x"] for t in good)


def test_several_objectives_box_the_feasible_front():
    objectives = [{"metric": "loss", "mode": "min"}, {"metric": "memory_gb", "mode": "min"}]
    raw = {k: v for k, v in BASE.items() if k != "objective"}
    first = make_runner(parse_experiment(merge(raw, {"objectives": objectives, "searchSpace": SPACE,
                                                     "search": {"algorithm": "nsgaii", "seed": 2},
                                                     "budget": {"maxTrials": 30}})), name="first")
    Simulator(first, loss, trial_length=1).run()
    done = [t for t in first.trials.values() if t.phase.value == "Succeeded"]
    values = {t.name: (t.latest["loss"], t.latest["memory_gb"]) for t in done}
    front = [t for t in done if not any(all(a <= b for a, b in zip(values[o.name], values[t.name]))
                                        and values[o.name] != values[t.name] for o in done)]
    searcher = Searcher(parse_experiment(merge(raw, {
        "objectives": objectives, "searchSpace": SPACE, "search": {"algorithm": "nsgaii", "seed": 2},
        "warmStart": {"experiments": ["first"], "searchSpace": "boundingBox"}})),
        warm_start=warm_trials("first", records_of(first)))
    assert searcher.space["x"].low == min(t.params["x"] for t in front)
    assert searcher.space["x"].high == max(t.params["x"] for t in front)
    assert f"best {len(front)} earlier trials" in searcher.warm_start_region


def test_initial_points_are_inside_the_box_and_asked_as_given(first):
    warm = warm_trials("first", records_of(first))
    point = {"x": -5.0, "y": 15.0, "n": 8, "opt": "rms"}
    searcher = Searcher(spec(search={"algorithm": "tpe", "seed": 7, "initialPoints": [point]}), warm_start=warm)
    assert searcher.space["x"].low == -5.0 and searcher.space["y"].high == 15.0
    assert searcher.suggest("second-0") == point


def test_one_best_configuration_leaves_the_whole_space(first):
    warm = warm_trials("first", records_of(first))
    best = min(warm, key=lambda w: w.metrics["loss"])
    searcher = Searcher(spec(), warm_start=[best, best])
    assert searcher.space == dict(spec().search_space)
    assert "one configuration" in searcher.warm_start_region


def test_pbt_explores_inside_the_box(first):
    import random
    warm = warm_trials("first", records_of(first))
    searcher = Searcher(spec(), warm_start=warm)
    rng = random.Random(0)
    for _ in range(200):
        x = searcher.resample("x", rng)
        assert searcher.space["x"].low <= x <= searcher.space["x"].high
