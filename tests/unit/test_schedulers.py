"""Schedulers: ASHA / HyperBand / median / percentile wrap Optuna pruners; PBT is ours."""
import random
import re

import numpy as np
import optuna
import pytest

from kubetune.core.schedulers import Action
from kubetune.core.schedulers.asha import ASHAScheduler
from kubetune.core.schedulers.pbt import PBTScheduler
from kubetune.core.schedulers.pbt import perturb
from kubetune.core.search import Searcher
from kubetune.core.simulate import Simulator
from kubetune.core.trial import TrialInfo
from kubetune.core.types import LaunchTrial, PauseTrial, Result, StopTrial, TrialPhase
from kubetune.spec.model import Param
from unit_helpers import make_runner, make_spec, of_type, quadratic


def asha_spec(mode="min", **sched):
    return make_spec(objective={"metric": "loss", "mode": mode},
                     scheduler={"type": "asha", "maxIterations": 100, "gracePeriod": 1, "reductionFactor": 3, **sched})


@pytest.mark.parametrize("mode", ["min", "max"])
def test_asha_decides_exactly_like_optunas_pruner_on_the_full_study(mode):
    """The wrapper hands the pruner only the trials that reached the judged rung; the
    decisions must equal a plain SuccessiveHalvingPruner on the whole study."""
    spec = asha_spec(mode)
    searcher = Searcher(spec)
    scheduler = ASHAScheduler(spec, searcher)
    plain = optuna.create_study(direction="minimize" if mode == "min" else "maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    plain_pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    rng = random.Random(7)
    live = {}
    for i in range(60):
        name = f"t-{i}"
        searcher.suggest(name)
        live[name] = [plain.ask(searcher.distributions), TrialInfo(name, i, {}), 0]
        # Interleave the live trials; steps sometimes jump several rungs at once.
        for _ in range(rng.randint(1, 4)):
            name = rng.choice(sorted(live))
            plain_trial, info, step = live[name]
            step += rng.choice([1, 1, 2, 5, 9])
            value = rng.random() + 1.0 / step
            live[name][2] = info.iteration = step
            searcher.report_intermediate(name, step, value)
            plain_trial.report(value, step)
            ours = scheduler.on_trial_result(info, value).action is Action.STOP
            theirs = plain_pruner.prune(plain, plain._storage.get_trial(plain_trial._trial_id))
            assert ours == theirs, (name, step)
            if ours:
                searcher.complete(name, None, TrialPhase.STOPPED)
                plain.tell(plain_trial, state=optuna.trial.TrialState.PRUNED)
                del live[name]


def run_asha(trials=30, **sim_kw):
    spec = make_spec(scheduler={"type": "asha", "maxIterations": 27}, budget={"maxTrials": trials, "parallelism": 3})
    runner = make_runner(spec)
    sim = Simulator(runner, sim_kw.pop("curve", quadratic), **sim_kw)
    sim.run()
    return runner, sim


def test_asha_stop_message_names_the_rung_and_the_cutoff_it_used():
    runner, sim = run_asha()
    stops = [d for d in of_type(sim.log, StopTrial) if d.reason == "EarlyStopped"]
    assert stops
    pattern = re.compile(r"below rung (\d) cutoff ([\d.e-]+): loss ([\d.e-]+) at rung iteration (\d+) "
                         r"is not in the top 1/3 of the (\d+) trials that reached it")
    for stop in stops:
        rung, cutoff, value, milestone, count = pattern.fullmatch(stop.message).groups()
        assert int(milestone) == 3 ** int(rung)
        assert float(value) > float(cutoff)                      # worse, for a min objective
        trial = runner.trials[stop.name]
        assert trial.iteration == int(milestone) and trial.phase is TrialPhase.STOPPED
    # Most trials stop at the first rung, a few go all the way.
    assert sum(t.reason == "MaxIterationsReached" for t in runner.trials.values()) < 15
    assert runner.finished.reason == "MaxTrialsReached"


def test_asha_first_trial_at_an_empty_rung_continues():
    spec = asha_spec()
    searcher = Searcher(spec)
    scheduler = ASHAScheduler(spec, searcher)
    searcher.suggest("a")
    info = TrialInfo("a", 0, {})
    for step, value in [(1, 5.0), (3, 5.0), (9, 5.0), (27, 5.0)]:    # bad values, but alone at each rung
        info.iteration = step
        searcher.report_intermediate("a", step, value)
        assert scheduler.on_trial_result(info, value).action is Action.CONTINUE


def test_asha_trial_that_errors_mid_rung_retries_and_is_still_judged_once_per_rung():
    failed = []

    def faults(name, attempt, iteration):
        # The first trial past rung 1 (iteration 3) dies before reporting 4, so it restarts
        # from its checkpoint at 2 and reports the rung-1 iteration 3 a second time.
        if iteration == 4 and not failed:
            failed.append(name)
            return "error"
        return None
    spec = make_spec(scheduler={"type": "asha", "maxIterations": 27}, budget={"maxTrials": 12, "parallelism": 3},
                     trial={"maxFailures": 1})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic, checkpoint_every=2, faults=faults)
    sim.run()
    retried = runner.trials[failed[0]]
    assert retried.attempt == 1 and retried.failures == 1
    relaunch = [d for d in of_type(sim.log, LaunchTrial) if d.name == retried.name][1]
    assert (relaunch.start_iteration, relaunch.checkpoint) == (2, f"sim://{retried.name}/2")
    # The history keeps one entry per iteration: the retry's 3 replaces the lost run's 3.
    assert [h["iteration"] for h in retried.history][:5] == [1, 2, 3, 4, 5]
    # Each trial is recorded once at each rung it reached, re-reported iterations included.
    milestones = [1, 3, 9, 27]
    for rung, milestone in enumerate(milestones):
        reached = sum(1 for t in runner.trials.values() if max(h["iteration"] for h in t.history) >= milestone)
        assert len(runner.scheduler._rung_values.get((0, rung), [])) == reached
    assert runner.finished.reason == "MaxTrialsReached"


def test_hyperband_explains_the_bracket_and_never_stops_the_full_budget_bracket_early():
    spec = make_spec(scheduler={"type": "hyperband", "maxIterations": 9}, budget={"maxTrials": 40, "parallelism": 4})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    sim.run()
    stops = [d for d in of_type(sim.log, StopTrial) if d.reason == "EarlyStopped"]
    assert stops and all(re.search(r"in bracket [01]$", d.message) for d in stops)
    brackets = {0: 0, 1: 0, 2: 0}
    for trial in runner.trials.values():
        frozen = runner.searcher.study.trials[trial.index]
        brackets[runner.scheduler.bracket(frozen)] += 1
    assert all(brackets.values())                      # every bracket got trials


def _one_at_a_time_with_grace_four(scheduler: dict, mode: str = "min"):
    """16 trials of ``1/t + x`` (negated for ``max``), one at a time, under ``scheduler``
    (``gracePeriod`` 4); returns the runner, its early stops by trial name, and the
    rule replayed here: from the 4th trial on, ``cut(values)`` of the completed trials'
    values at iteration 4, and which trials had a worse value there (name -> cut)."""
    spec = make_spec(objective={"metric": "loss", "mode": mode},
                     scheduler={"maxIterations": 10, "gracePeriod": 4, **scheduler},
                     budget={"maxTrials": 16, "parallelism": 1})
    runner = make_runner(spec)
    sign = 1.0 if mode == "min" else -1.0
    sim = Simulator(runner, lambda p, t: sign * (1.0 / t + p["x"]))
    sim.run()
    stops = {d.name: d for d in of_type(sim.log, StopTrial) if d.reason == "EarlyStopped"}
    for name in stops:
        assert runner.trials[name].iteration == 4

    def replay(cut) -> dict:
        completed, expected = [], {}
        for trial in sorted(runner.trials.values(), key=lambda t: t.index):
            at_four = sign * (0.25 + trial.params["x"])
            bound = cut(completed) if len(completed) >= 3 else None
            if bound is not None and (at_four > bound if mode == "min" else at_four < bound):
                expected[trial.name] = bound
            else:
                completed.append(at_four)
        return expected
    return stops, replay


def test_median_stops_below_the_median_of_completed_trials_after_grace():
    stops, replay = _one_at_a_time_with_grace_four({"type": "median"})
    expected = replay(np.median)
    assert set(stops) == set(expected) and len(stops) >= 3
    for name, stop in stops.items():
        assert stop.message.startswith(f"below median {expected[name]:.4g} of ")
        assert "completed trials at iteration 4: best loss so far" in stop.message


@pytest.mark.parametrize("mode", ["min", "max"])
def test_percentile_keeps_the_top_fraction_of_completed_trials_after_grace(mode):
    """quantileFraction 0.25: from the 4th trial on, a trial whose value at iteration 4
    is outside the best quarter of the completed trials' values there is stopped (Optuna's
    PercentilePruner(25)); stricter than the median rule on the same trials."""
    stops, replay = _one_at_a_time_with_grace_four({"type": "percentile", "quantileFraction": 0.25}, mode)
    expected = replay(lambda values: np.percentile(values, 25 if mode == "min" else 75))
    assert set(stops) == set(expected) and len(stops) >= 6
    for name, stop in stops.items():
        assert stop.message.startswith(f"outside the top 25% (cut {expected[name]:.4g}) of ")


def test_pbt_perturbation_stays_in_bounds_and_moves_choices_to_neighbours():
    rng = random.Random(0)
    uni = Param("uniform", low=0.0, high=1.0)
    assert {round(perturb(uni, 0.5, rng), 6) for _ in range(40)} == {0.4, 0.6}
    assert all(perturb(uni, 0.99, rng) <= 1.0 for _ in range(20))
    ints = Param("randint", low=1, high=5)
    assert all(1 <= perturb(ints, v, rng) <= 4 and perturb(ints, v, rng) != v or v in (1, 4)
               for v in (1, 2, 3, 4) for _ in range(10))
    q = Param("quniform", low=16, high=256, q=16)
    assert all(perturb(q, 128, rng) in (96, 160) for _ in range(20))
    choice = Param("choice", choices=("a", "b", "c"))
    assert {perturb(choice, "b", rng) for _ in range(30)} == {"a", "c"}
    assert {perturb(choice, "a", rng) for _ in range(30)} == {"a", "b"}


def test_pbt_exploits_a_top_trial_checkpoint_and_records_lineage():
    spec = make_spec(searchSpace={"x": {"uniform": [0, 1]}, "depth": {"choice": [2, 4, 8]}},
                     scheduler={"type": "pbt", "maxIterations": 20, "perturbationInterval": 4,
                                "quantileFraction": 0.25, "resampleProbability": 0.0},
                     budget={"maxTrials": 8, "parallelism": 8})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic, checkpoint_every=2)
    sim.run()
    pauses = of_type(sim.log, PauseTrial)
    assert pauses and all(p.reason == "Exploit" for p in pauses)
    exploited = [t for t in runner.trials.values() if t.lineage]
    assert exploited
    for trial in exploited:
        event = trial.lineage[0]
        donor = runner.trials[event["from"]]
        assert donor.name != trial.name and trial.parent is not None
        assert 0 <= event["params"]["x"] <= 1 and event["params"]["depth"] in (2, 4, 8)
        relaunch = [d for d in of_type(sim.log, LaunchTrial) if d.name == trial.name][1]
        assert relaunch.checkpoint.startswith(f"sim://{event['from']}/")
        assert relaunch.start_iteration == event["iteration"] and relaunch.attempt == 1
    assert runner.finished.reason == "MaxTrialsReached"
    assert all(t.iteration == 20 for t in runner.trials.values())


def test_pbt_results_from_before_the_exploit_are_ignored():
    spec = make_spec(scheduler={"type": "pbt", "maxIterations": 50, "perturbationInterval": 2},
                     budget={"maxTrials": 4, "parallelism": 4})
    runner = make_runner(spec)
    runner.step(0.0)
    losses = {"exp-0": 0.1, "exp-1": 0.2, "exp-2": 0.3, "exp-3": 0.9}
    out = []
    for seq, it in enumerate((1, 2)):
        for name, loss in losses.items():
            out += runner.on_trial_result(name, Result(seq, it, {"loss": loss}, 1.0, f"ck://{name}/{it}", 0), 1.0)
    pause = of_type(out, PauseTrial)
    assert [p.name for p in pause] == ["exp-3"]
    launch = of_type(out, LaunchTrial)[0]
    assert launch.name == "exp-3" and launch.checkpoint == "ck://exp-0/2" and launch.attempt == 1
    # A late result of the paused run (attempt 0) is dropped; the new run's is recorded.
    assert runner.on_trial_result("exp-3", Result(2, 3, {"loss": 0.95}, 2.0, None, 0), 2.0) == []
    runner.on_trial_result("exp-3", Result(2, 3, {"loss": 0.15}, 2.0, None, 1), 2.0)
    assert runner.trials["exp-3"].history[-1] == {"loss": 0.15, "iteration": 3}
    assert runner.trials["exp-3"].parent == "exp-0"


def test_pbt_explore_resamples_when_asked():
    spec = make_spec(searchSpace={"x": {"uniform": [0, 1]}}, scheduler={"type": "pbt", "resampleProbability": 1.0})
    searcher = Searcher(spec)
    scheduler = PBTScheduler(spec, searcher)
    rng = random.Random(0)
    values = {round(scheduler.explore({"x": 0.5}, rng)["x"], 6) for _ in range(20)}
    assert len(values) > 10 and not values & {0.4, 0.6}


@pytest.mark.parametrize("high", [10**6, 2**31 - 1])
def test_pbt_explores_a_huge_integer_range_in_constant_memory(high):
    """A PBT ``seed: {randint: [0, 2147483647]}`` used to build the list of every value
    (~80 GiB) on each resample and, as quniform, on each perturb and study start."""
    import tracemalloc

    spec = make_spec(searchSpace={"seed": {"randint": [0, high]}, "steps": {"quniform": [0, high, 1]},
                                  "lr": {"quniform": [0.0, 1.0, 1e-6]}},
                     scheduler={"type": "pbt", "perturbationInterval": 2, "resampleProbability": 0.5})
    tracemalloc.start()
    try:
        searcher = Searcher(spec)
        pbt = PBTScheduler(spec, searcher)
        params = searcher.suggest("t0")
        rng = random.Random(0)
        for _ in range(10):
            params = pbt.explore(params, rng)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak                     # the 10**6 grid alone was 38 MiB
    assert 0 <= params["seed"] < high and isinstance(params["seed"], int)
    assert 0 <= params["steps"] <= high and isinstance(params["steps"], int)
    assert 0.0 <= params["lr"] <= 1.0


def test_grid_arithmetic_matches_the_grid():
    for param in (Param("quniform", low=0.1, high=1.0, q=0.3), Param("quniform", low=2, high=11, q=3),
                  Param("randint", low=-3, high=4)):
        values = param.grid_values()
        assert [param.grid_value(i) for i in range(param.grid_size())] == values
        for x in [-10, -0.2, 0.25, 0.4, 0.55, 3.2, 5, 6.5, 7, 99]:
            assert param.nearest_grid_value(x) == min(values, key=lambda v: abs(v - x)), (param, x)
