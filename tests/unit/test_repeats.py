"""A sampler proposing parameters already evaluated (issue 28): the repeat is a Reused
Trial that does not use up maxTrials, and a search proposing only repeats ends with
reason SearchConverged (core/repeats.py)."""
from kubetune.controller import render
from kubetune.core.repeats import REPEATS_IN_A_ROW, Repeats
from kubetune.core.simulate import Simulator
from kubetune.core.types import LaunchTrial
from kubetune.spec import parse_experiment
from unit_helpers import BASE, make_runner, merge, of_type, records_of


def test_the_tally_counts_repeats_in_a_row_and_in_all():
    repeats = Repeats()
    for reused in [False, True, True, False] + [True] * (REPEATS_IN_A_ROW - 1):
        repeats.note(reused)
    assert repeats.counted(created=4 + REPEATS_IN_A_ROW - 1) == 2
    assert repeats.converged(max_trials=1000) == ""
    repeats.note(True)
    assert f"last {REPEATS_IN_A_ROW} suggestions" in repeats.converged(max_trials=1000)
    capped = Repeats()
    capped.restore([True, False, True])
    assert (capped.reused, capped.in_a_row) == (2, 1)
    assert "as many as maxTrials" in capped.converged(max_trials=2) and capped.converged(max_trials=3) == ""


def _two_points(max_trials: int):
    spec = parse_experiment(merge(BASE, {"searchSpace": {"x": {"choice": [1, 2]}},
                                         "search": {"algorithm": "random", "seed": 3},
                                         "budget": {"maxTrials": max_trials, "parallelism": 1}}))
    runner = make_runner(spec)
    sim = Simulator(runner, lambda p, i: float(p["x"]), trial_length=2)
    return runner, sim


def test_a_search_proposing_only_repeats_ends_converged_not_at_max_trials():
    runner, sim = _two_points(max_trials=100)
    sim.run()
    launched = {d.params["x"] for d in of_type(sim.log, LaunchTrial)}
    reused = [t for t in runner.trials.values() if t.reason == "Reused"]
    assert launched == {1, 2} and len(of_type(sim.log, LaunchTrial)) == 2
    assert runner.finished.phase == "Succeeded" and runner.finished.reason == "SearchConverged"
    assert f"last {REPEATS_IN_A_ROW} suggestions" in runner.finished.message
    assert "2 trials ran of maxTrials 100" in runner.finished.message
    # the Reused Trials are all there, and the tail of them is the run that ended it
    names = sorted(runner.trials, key=lambda n: runner.trials[n].index)
    assert all(runner.trials[n].reason == "Reused" for n in names[-REPEATS_IN_A_ROW:])
    assert runner.counted == 2 and len(reused) == len(runner.trials) - 2 < 100
    # progress counts what maxTrials counts
    summary = runner.summary(sim.now)
    status = render.experiment_status(summary, total=100, previous={}, generation=1, now=sim.now, suspended=False)
    assert status["progress"] == "2/100"
    assert status["trialCounts"]["succeeded"] == len(runner.trials)


def test_reused_trials_leave_max_trials_to_trials_that_run():
    runner, sim = _two_points(max_trials=2)
    sim.run()
    assert runner.finished.reason == "MaxTrialsReached" and runner.counted == 2
    assert {d.params["x"] for d in of_type(sim.log, LaunchTrial)} == {1, 2}


def test_a_restarted_runner_keeps_the_tally():
    """Rebuilt from the Trials alone (no recorded outcome): the same counts, and the
    converged search ends again at its first step, creating nothing."""
    runner, sim = _two_points(max_trials=100)
    sim.run()
    restored = make_runner(runner.spec)
    restored.restore(records_of(runner))
    assert restored.counted == runner.counted == 2
    assert (restored._repeats.reused, restored._repeats.in_a_row) == (runner._repeats.reused, runner._repeats.in_a_row)
    restored.step(sim.now)
    assert restored.finished.reason == "SearchConverged" and len(restored.trials) == len(runner.trials)
