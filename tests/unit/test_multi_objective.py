"""Several objectives, constraints, MO-ASHA, warm start, initial points and reuse, driven
through the real runner in simulated time. The expected answers are computed here with
plain loops, independently of the Optuna helpers the code uses."""
import dataclasses
import json
import math

import optuna
import pytest

from kubetune.controller import render
from kubetune.core.pareto import FrontPoint, Outcomes
from kubetune.core.schedulers import Action, scheduler_class
from kubetune.core.schedulers.mo_asha import MOASHAScheduler
from kubetune.core.search import Searcher
from kubetune.core.warm_trials import warm_trials
from kubetune.core.simulate import Simulator
from kubetune.core.trial import TrialInfo
from kubetune.core.types import ExperimentSummary, LaunchTrial, StopTrial, TrialPhase
from kubetune.spec import SpecError, parse_experiment
from unit_helpers import BASE, make_runner, merge, of_type, records_of

TWO = [{"metric": "loss", "mode": "min"}, {"metric": "size", "mode": "min"}]


def mo_spec(objectives=TWO, **sections):
    raw = merge({k: v for k, v in BASE.items() if k != "objective"}, sections)
    raw["objectives"] = objectives
    return parse_experiment(raw)


def dominates(a, b):
    """a and b are (loss, size), both minimised."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def final(trial, metric):
    return [h[metric] for h in trial.history if metric in h][-1]


# ---------------------------------------------------------------- spec

@pytest.mark.parametrize("change, path, words", [
    ({"objective": {"metric": "loss", "mode": "min"}}, "spec.objectives", "not both"),
    ({"search": {"algorithm": "cmaes"}}, "spec.search.algorithm", "cmaes"),
    ({"search": {"algorithm": "gp"}}, "spec.search.algorithm", "gp"),
    ({"scheduler": {"type": "median"}}, "spec.scheduler.type", "median"),
    ({"scheduler": {"type": "pbt"}}, "spec.scheduler.type", "pbt"),
    ({"scheduler": {"type": "hyperband", "maxIterations": 9}}, "spec.scheduler.type", "hyperband"),
])
def test_several_objectives_refuse_what_cannot_rank_vectors_naming_it(change, path, words):
    raw = merge({k: v for k, v in BASE.items() if k != "objective"}, change)
    raw["objectives"] = TWO
    with pytest.raises(SpecError) as error:   # what the operator checks of a spec (controller/intake.py)
        scheduler_class(parse_experiment(raw))
    assert error.value.path == path and words in error.value.message


def test_spec_forms_and_their_errors():
    single = parse_experiment(BASE)
    assert single.objectives == (single.objective,) and not single.multi_objective
    spec = mo_spec([{"metric": "loss", "mode": "min", "reference": 2}, {"metric": "acc", "mode": "max", "reference": 0}],
                   constraints=[{"metric": "mem", "max": 16}], search={"algorithm": "nsgaii"})
    assert spec.multi_objective and spec.reference_point == (2.0, 0.0) and spec.constraints[0].max == 16
    with pytest.raises(SpecError, match=r"objectives\[1\]\.reference"):
        mo_spec([{"metric": "loss", "mode": "min", "reference": 2}, {"metric": "acc", "mode": "max"}])
    with pytest.raises(SpecError, match=r"constraints\[0\]: needs max or min"):
        mo_spec(constraints=[{"metric": "mem"}])
    with pytest.raises(SpecError, match=r"initialPoints\[0\]\.x: 2 is outside"):
        mo_spec(search={"initialPoints": [{"x": 2}]})
    with pytest.raises(SpecError, match=r"initialPoints\[0\]\.y: not a parameter"):
        mo_spec(search={"initialPoints": [{"x": 0.5, "y": 1}]})
    with pytest.raises(SpecError, match=r"warmStart\.experiments\[0\]"):
        mo_spec(warmStart={"experiments": ["Not_A_Name"]})
    with pytest.raises(SpecError, match=r"objectives\[1\]\.metric: 'loss' is already"):
        mo_spec([{"metric": "loss", "mode": "min"}, {"metric": "loss", "mode": "max"}])


# ---------------------------------------------------------------- front and constraints

def tradeoff(params, iteration):
    """loss falls with x and iterations, size grows with x: a true trade-off; mem ~ size."""
    x = params["x"]
    return {"loss": (1 - x) ** 2 + 0.5 / iteration + 0.05 * params.get("y", 0), "size": x * 10, "mem": x * 10}


@pytest.mark.parametrize("algorithm", ["nsgaii", "tpe", "random"])
def test_pareto_front_equals_the_non_dominated_feasible_trials(algorithm):
    spec = mo_spec([{"metric": "loss", "mode": "min", "reference": 3}, {"metric": "size", "mode": "min", "reference": 11}],
                   searchSpace={"x": {"uniform": [0, 1]}, "y": {"uniform": [0, 1]}},
                   constraints=[{"metric": "mem", "max": 7}], search={"algorithm": algorithm, "seed": 5},
                   scheduler={"type": "asha", "maxIterations": 9}, budget={"maxTrials": 40, "parallelism": 4})
    runner = make_runner(spec)
    Simulator(runner, tradeoff).run()
    done = [t for t in runner.trials.values() if t.phase is TrialPhase.SUCCEEDED]
    feasible = [t for t in done if final(t, "mem") <= 7]
    assert len(feasible) < len(done), "the seed should produce some infeasible trials"
    for trial in done:
        assert bool(trial.infeasible) == (final(trial, "mem") > 7)
    points = {t.name: (final(t, "loss"), final(t, "size")) for t in feasible}
    expected = {name for name, p in points.items() if not any(dominates(q, p) for q in points.values())}
    outcomes = runner.summary(0).outcomes
    assert outcomes.front_size == len(expected)
    assert {p.trial for p in outcomes.front} == expected
    for point in outcomes.front:
        assert (point.values["loss"], point.values["size"]) == points[point.trial]
        assert point.params == runner.trials[point.trial].params
    # hypervolume of the last entry, by a plain 2-D sweep over the front inside the reference
    inside = sorted(p for name, p in points.items() if name in expected and p[0] < 3 and p[1] < 11)
    area, top = 0.0, 11.0
    for loss, size in inside:
        area += (3 - loss) * (top - size)
        top = size
    assert outcomes.hypervolume[-1][1] == pytest.approx(area)
    assert outcomes.hypervolume[-1][0] == len(feasible)
    assert [v for _, v in outcomes.hypervolume] == sorted(v for _, v in outcomes.hypervolume)
    assert runner.finished.phase == "Succeeded" and runner.summary(0).best_trial is None


def test_front_and_feasibility_survive_a_restart_with_downsampled_histories():
    """A restarted operator may find only the last point of each history (bounded Trial
    status); the objective values persisted beside it keep the front and the marks."""
    spec = mo_spec(searchSpace={"x": {"uniform": [0, 1]}}, constraints=[{"metric": "mem", "max": 7}],
                   budget={"maxTrials": 20, "parallelism": 3})
    runner = make_runner(spec)
    # size and mem are reported at the first iteration only
    Simulator(runner, lambda p, i: {"loss": (1 - p["x"]) ** 2 + 1 / i, **({"size": p["x"], "mem": 10 * p["x"]}
                                                                          if i == 1 else {})},
              trial_length=4).run()
    records = [dataclasses.replace(r, history=r.history[-1:],
                                   latest_metrics=render.read_objective_values(
                                       render.trial_status(runner.trials[r.name])["objectiveValues"]))
               for r in records_of(runner)]
    restored = make_runner(spec)
    restored.restore(records)
    assert restored.summary(0).outcomes.front == runner.summary(0).outcomes.front
    assert runner.summary(0).outcomes.front_size > 1
    assert {n: t.infeasible for n, t in restored.trials.items()} == {n: t.infeasible for n, t in runner.trials.items()}
    assert any(t.infeasible for t in runner.trials.values())


def test_an_infeasible_trial_is_never_best_with_one_objective():
    spec = merge(BASE, {"constraints": [{"metric": "mem", "max": 5}], "budget": {"maxTrials": 20, "parallelism": 2},
                        "searchSpace": {"x": {"uniform": [0, 1]}}})
    runner = make_runner(parse_experiment(spec))
    # the lower x, the better the loss, and the more memory: the best loss is infeasible
    Simulator(runner, lambda p, i: {"loss": p["x"], "mem": 10 * (1 - p["x"])}, trial_length=3).run()
    summary = runner.summary(0)
    feasible = [t for t in runner.trials.values() if final(t, "mem") <= 5]
    assert summary.best_metric == min(final(t, "loss") for t in feasible)
    assert any(t.infeasible and final(t, "loss") < summary.best_metric for t in runner.trials.values())
    status = render.trial_status(next(t for t in runner.trials.values() if t.infeasible))
    assert status["infeasible"].startswith("mem ") and "> max 5" in status["infeasible"]


# ---------------------------------------------------------------- MO-ASHA

def test_mo_asha_stops_and_promotes_by_non_dominated_rank():
    spec = mo_spec(scheduler={"type": "asha", "maxIterations": 9, "gracePeriod": 1, "reductionFactor": 3})
    scheduler = MOASHAScheduler(spec, Searcher(spec))

    def result(name, iteration, loss, size):
        info = TrialInfo(name, 0, {}, iteration=iteration, latest={"loss": loss, "size": size})
        return scheduler.on_trial_result(info, loss).action

    assert result("a", 1, 1, 1) is Action.CONTINUE            # alone at rung 0
    assert result("b", 1, 2, 2) is Action.STOP                # dominated by a; 2 trials: only the best goes on
    assert result("c", 1, 0.5, 3) is Action.CONTINUE          # on the front with a
    assert result("d", 1, 3, 0.5) is Action.CONTINUE          # on the front too (4 trials: rank 0 goes on)
    assert result("e", 1, 5, 5) is Action.STOP                # dominated by everything
    assert result("a", 2, 1, 1) is Action.CONTINUE            # between rungs: not judged
    assert result("a", 3, 1, 1) is Action.CONTINUE            # alone at rung 1
    assert result("c", 3, 2, 2) is Action.STOP               # now dominated by a at rung 1
    assert result("f", 1, float("nan"), 1) is Action.STOP
    assert set(scheduler._rungs[0]) == {"a", "b", "c", "d", "e"}      # NaN is not recorded (as Optuna)


def test_mo_asha_with_one_objective_decides_exactly_like_optunas_asha_pruner():
    spec = parse_experiment(merge(BASE, {"scheduler": {"type": "asha", "maxIterations": 100}}))
    scheduler = MOASHAScheduler(spec, Searcher(spec))
    plain = optuna.create_study(direction="minimize")
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    import random
    rng = random.Random(3)
    live = {}
    for i in range(50):
        live[f"t{i}"] = [plain.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0]
        for _ in range(rng.randint(1, 4)):
            name = rng.choice(sorted(live))
            trial, step = live[name]
            step += rng.choice([1, 1, 2, 5])
            live[name][1] = step
            value = round(rng.random() + 1.0 / step, 2)           # ties happen
            trial.report(value, step)
            ours = scheduler.on_trial_result(TrialInfo(name, 0, {}, iteration=step, latest={"loss": value}),
                                             value).action is Action.STOP
            assert ours == pruner.prune(plain, plain._storage.get_trial(trial._trial_id)), (name, step)
            if ours:
                plain.tell(trial, state=optuna.trial.TrialState.PRUNED)
                del live[name]


def non_dominated_ranks(points):
    """Plain peeling: rank 0 is the front, rank 1 the front of the rest, ..."""
    ranks, left, rank = {}, set(range(len(points))), 0
    while left:
        layer = {i for i in left if not any(dominates(points[j], points[i]) for j in left)}
        ranks.update({i: rank for i in layer})
        left -= layer
        rank += 1
    return [ranks[i] for i in range(len(points))]


def test_mo_asha_in_simulation_matches_a_plain_recomputation_of_every_decision():
    """Known constant curves, one trial at a time: each trial is judged at rungs 1 and 3
    against the trials that reached that rung before it."""
    spec = mo_spec(searchSpace={"x": {"uniform": [0, 1]}, "y": {"uniform": [0, 1]}},
                   scheduler={"type": "asha", "maxIterations": 9}, budget={"maxTrials": 30, "parallelism": 1})
    runner = make_runner(spec)
    curve = lambda p, i: {"loss": p["x"], "size": p["y"]}    # noqa: E731
    Simulator(runner, curve).run()
    reached = {1: [], 3: []}
    for trial in sorted(runner.trials.values(), key=lambda t: t.index):
        point = (trial.params["x"], trial.params["y"])
        stopped_at = None
        for milestone in (1, 3):
            reached[milestone].append(point)
            ranks = non_dominated_ranks(reached[milestone])
            cutoff = sorted(ranks)[max(len(ranks) // 3 - 1, 0)]
            if ranks[-1] > cutoff:
                stopped_at = milestone
                break
        if stopped_at is None:
            assert trial.reason == "MaxIterationsReached" and trial.iteration == 9, trial.name
        else:
            assert (trial.reason, trial.iteration) == ("EarlyStopped", stopped_at), trial.name
    assert 3 < sum(t.reason == "EarlyStopped" for t in runner.trials.values()) < 30


def test_mo_asha_rungs_survive_a_restart():
    spec = mo_spec(searchSpace={"x": {"uniform": [0, 1]}, "y": {"uniform": [0, 1]}},
                   scheduler={"type": "asha", "maxIterations": 9}, budget={"maxTrials": 30, "parallelism": 4})
    runner = make_runner(spec)
    sim = Simulator(runner, lambda p, i: {"loss": p["x"] + 1 / i, "size": p["y"]})
    for _ in range(25):
        sim.tick()
    assert runner.active_trials() and not runner.finished
    restored = make_runner(spec)
    restored.restore(records_of(runner))
    assert restored.scheduler._rungs == runner.scheduler._rungs
    assert restored.scheduler._reached == runner.scheduler._reached
    # the same next results get the same decisions from both
    for name in runner.running_trials():
        a = runner.scheduler._judge(name, 27, [0.9, 0.9])
        b = restored.scheduler._judge(name, 27, [0.9, 0.9])
        assert a == b
    assert restored.summary(0).outcomes.front == runner.summary(0).outcomes.front
    # from each trial's persisted state alone (no history), the same rungs
    states = {name: runner.scheduler.trial_state(trial) for name, trial in runner.trials.items()}
    assert all(len(state["rungs"]) <= 3 for state in states.values() if state)
    bare = MOASHAScheduler(spec, Searcher(spec))
    bare.restore([TrialInfo(t.name, t.index, {}) for t in runner.trials.values()], json.loads(json.dumps(states)))
    assert bare._rungs == runner.scheduler._rungs and bare._reached == runner.scheduler._reached


# ---------------------------------------------------------------- reuse, warm start, initial points

SMALL = {"a": {"choice": [1, 2, 3]}, "b": {"choice": ["p", "q"]}}


def small_curve(params, iteration):
    return {"loss": params["a"] + (params["b"] == "q") * 0.5}


def test_an_evaluated_configuration_is_reused_not_run_again():
    spec = parse_experiment(merge(BASE, {"searchSpace": SMALL, "budget": {"maxTrials": 20, "parallelism": 1}}))
    runner = make_runner(spec)
    sim = Simulator(runner, small_curve, trial_length=2)
    sim.run()
    launched = [tuple(sorted(d.params.items())) for d in of_type(sim.log, LaunchTrial)]
    assert len(launched) == len(set(launched)) <= 6
    reused = [t for t in runner.trials.values() if t.reason == "Reused"]
    assert len(reused) == 20 - len(launched) > 0
    for trial in reused:
        source = runner.trials[trial.message.split()[3].rstrip(":")]
        assert source.params == trial.params and final(trial, "loss") == final(source, "loss")
    outcomes = runner.summary(0).outcomes
    assert outcomes.reused_count == len(reused) and len(outcomes.reused) == min(len(reused), 10)
    # after a restart the reused trials are still reused, and nothing evaluated runs again
    restored = make_runner(spec)
    restored.restore(records_of(runner))
    assert restored.summary(0).outcomes.reused_count == len(reused)
    assert restored.searcher.evaluated({"a": 1, "b": "p"}) is not None


def test_warm_start_seeds_the_search_and_reports_mismatches():
    first = make_runner(parse_experiment(merge(BASE, {"searchSpace": SMALL, "budget": {"maxTrials": 6}})), name="first")
    Simulator(first, small_curve, trial_length=2).run()
    warm = warm_trials("first", records_of(first))
    assert len(warm) == sum(t.phase is TrialPhase.SUCCEEDED for t in first.trials.values())
    # a narrower space: trials with a=3 fall outside it; b is dropped from nothing (same names)
    narrower = {"a": {"choice": [1, 2]}, "b": {"choice": ["p", "q"]}}
    spec = parse_experiment(merge(BASE, {"searchSpace": narrower, "budget": {"maxTrials": 4, "parallelism": 1},
                                         "warmStart": {"experiments": ["first"]},
                                         "constraints": [{"metric": "loss", "max": 10}]}))
    second = make_runner(spec, name="second", warm_start=warm, warm_start_notes=["gone: no succeeded Trials"])
    sim = Simulator(second, small_curve, trial_length=2)
    sim.run()
    outside = [w for w in warm if w.params["a"] == 3]
    outcomes = second.summary(0).outcomes
    assert outcomes.warm_start_used == len(warm) - len(outside)
    assert outcomes.warm_start_skipped == len(outside) + 1
    assert outcomes.warm_start_problems[0].startswith("gone")
    assert all("outside this search space" in p for p in outcomes.warm_start_problems[1:])
    # the warm trials cover the narrower space: nothing is run, everything is reused from "first"
    seen = {tuple(sorted(w.params.items())) for w in warm if w.params["a"] != 3}
    launched = {tuple(sorted(d.params.items())) for d in of_type(sim.log, LaunchTrial)}
    assert not launched & seen
    assert all(s.startswith("first/") for _, s in outcomes.reused)
    # a space with a parameter the earlier trials lack cannot use them
    wider = parse_experiment(merge(BASE, {"searchSpace": {**SMALL, "c": {"uniform": [0, 1]}}}))
    assert Searcher(wider, warm_start=warm).warm_start_problems[0].endswith("has no value for c")


def test_initial_points_are_asked_first_in_order_also_after_a_restart():
    points = [{"x": 0.1}, {"x": 0.2}, {"x": 0.3}]
    spec = parse_experiment(merge(BASE, {"search": {"algorithm": "tpe", "seed": 1, "initialPoints": points},
                                         "budget": {"maxTrials": 5, "parallelism": 1}}))
    runner = make_runner(spec)
    sim = Simulator(runner, lambda p, i: p["x"], trial_length=2)
    while len(runner.trials) < 2:
        sim.tick()
    restored = make_runner(spec)
    restored.restore(records_of(runner))
    resumed = Simulator(restored, lambda p, i: p["x"], trial_length=2)
    resumed.reattach()
    resumed.run()
    params = [restored.trials[f"exp-{i}"].params["x"] for i in range(5)]
    assert params[:3] == [0.1, 0.2, 0.3] and all(p not in (0.1, 0.2, 0.3) for p in params[3:])


# ---------------------------------------------------------------- status size

def test_pareto_front_status_is_bounded_whatever_the_parameters():
    params = {f"param_{i:02d}": "v" * 300 for i in range(64)}
    front = tuple(FrontPoint(f"exp-{i}", params, {"loss": float(i), "size": math.inf if i == 0 else -i})
                  for i in range(50))
    outcomes = Outcomes(front_size=4000, front=front, hypervolume=tuple((k, k * 0.5) for k in range(1, 21)),
                        reused_count=900, reused=tuple((f"exp-{i}", "other/" + "x" * 500) for i in range(10)))
    summary = ExperimentSummary(counts={p.value: 0 for p in TrialPhase}, created=4000, max_trials=4000,
                                outcomes=outcomes)
    status = render.experiment_status(summary, total=4000, previous={}, generation=1, now=0.0, suspended=False)
    body = json.dumps({"metadata": {"name": "x" * 63}, "spec": {}, "status": status}, allow_nan=False)
    assert len(body.encode()) < 12 * 1024
    front_status = status["paretoFront"]
    assert front_status["size"] == 4000 and front_status["shown"] == len(front_status["points"]) >= 1
    assert front_status["points"][0]["values"]["size"] == "Infinity"
    assert status["reusedTrials"]["count"] == 900 and len(status["reusedTrials"]["trials"]) == 10
    assert len(status["hypervolume"]["history"]) == 20
