"""TrialRunner driven by the simulated executor and a fake clock."""
import pytest

from kubetune.core.resources import Resources, ResourceLedger
from kubetune.core.simulate import Simulator
from kubetune.core.samplers import missing_packages
from kubetune.core.types import CreateTrial, LaunchTrial, Result, StopTrial, TrialPhase, TrialPhaseChanged
from unit_helpers import cpu_ledger, make_runner, make_spec, of_type, quadratic, records_of


def run(spec, ledger=None, max_ticks=10_000, **sim_kw):
    runner = make_runner(spec, ledger)
    sim = Simulator(runner, sim_kw.pop("curve", quadratic), **sim_kw)
    sim.run(max_ticks)
    return runner, sim


def test_fifo_runs_every_trial_to_max_iterations_within_parallelism():
    spec = make_spec(scheduler={"maxIterations": 5}, budget={"maxTrials": 7, "parallelism": 3})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    peak = 0
    while not runner.finished:
        sim.tick()
        peak = max(peak, len(sim.running))
        assert runner.summary(sim.now).counts["Running"] <= 3
    assert peak == 3
    assert [d.name for d in of_type(sim.log, CreateTrial)] == [f"exp-{i}" for i in range(7)]
    assert runner.finished.phase == "Succeeded" and runner.finished.reason == "MaxTrialsReached"
    assert {t.reason for t in runner.trials.values()} == {"MaxIterationsReached"}
    assert sim.iterations_run == 7 * 5
    best = min(runner.trials.values(), key=lambda t: t.best_value)
    summary = runner.summary(sim.now)
    assert summary.best_trial == best.name and summary.best_metric == best.best_value
    assert summary.counts["Succeeded"] == 7 and summary.created == 7


ALGORITHMS = ["random", "grid", "tpe"] + [
    pytest.param(a, marks=pytest.mark.skipif(bool(missing_packages(a)), reason=f"needs {missing_packages(a)}"))
    for a in ("cmaes", "qmc", "gp")]
SCHEDULERS = ["fifo", "asha", "hyperband", "median", "pbt"]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_with_every_scheduler(algorithm, scheduler):
    space = {"x": {"quniform": [0, 1, 0.05]}, "y": {"choice": [1, 2, 3]}}
    spec = make_spec(searchSpace=space, search={"algorithm": algorithm, "seed": 5},
                     scheduler={"type": scheduler, "maxIterations": 9, "perturbationInterval": 2},
                     budget={"maxTrials": 14, "parallelism": 4}, trial={"resources": {"cpu": 1}})
    ledger = cpu_ledger(3)
    runner = make_runner(spec, ledger)
    sim = Simulator(runner, lambda p, t: (p["x"] - 0.3) ** 2 + p["y"] / t)
    while not runner.finished:
        sim.tick()
        assert ledger.free().cpu >= 0 and ledger.used().cpu <= 3
        assert len(sim.running) <= 3
        assert sim.now < 1000
    assert ledger.used() == Resources()
    assert runner.finished.phase == "Succeeded"
    assert runner.summary(sim.now).created == 14
    stops = [d for d in of_type(sim.log, StopTrial) if d.reason == "EarlyStopped"]
    if scheduler in ("asha", "hyperband"):
        assert stops and all("cutoff" in d.message for d in stops)
    if scheduler == "median":
        assert all("median" in d.message for d in stops)
    if scheduler in ("fifo", "pbt"):
        assert not stops
    if scheduler == "pbt":
        assert any(t.lineage for t in runner.trials.values())
    # Parameters of fresh trials never repeat for grid search.
    if algorithm == "grid":
        created = [tuple(sorted(d.params.items())) for d in of_type(sim.log, CreateTrial)]
        assert len(set(created)) == len(created)


def test_goal_reached_finishes_the_experiment_and_stops_the_rest():
    spec = make_spec(objective={"goal": 0.2}, scheduler={"maxIterations": 50}, budget={"maxTrials": 20, "parallelism": 4})
    runner, sim = run(spec)
    assert runner.finished.reason == "GoalReached" and runner.finished.phase == "Succeeded"
    winner = [t for t in runner.trials.values() if t.reason == "GoalReached"]
    assert len(winner) == 1 and winner[0].phase is TrialPhase.SUCCEEDED
    assert winner[0].name in runner.finished.message and "goal 0.2" in runner.finished.message
    others = [t for t in runner.trials.values() if t.reason == "ExperimentFinished"]
    assert others and all(t.phase is TrialPhase.STOPPED for t in others)
    assert not sim.running


def test_max_failed_trials_fails_with_count_and_last_error():
    spec = make_spec(scheduler={"maxIterations": 5}, budget={"maxTrials": 10, "parallelism": 2, "maxFailedTrials": 1})
    runner, sim = run(spec, faults=lambda name, attempt, it: "error" if it == 2 and name != "exp-0" else None)
    assert runner.finished.phase == "Failed" and runner.finished.reason == "MaxFailedTrialsReached"
    assert runner.finished.message.startswith("2 trials failed (maxFailedTrials is 1); last error: exp-")
    assert "simulated error at iteration 2" in runner.finished.message


def test_error_retries_from_latest_checkpoint_then_fails_after_max_failures():
    spec = make_spec(scheduler={"maxIterations": 20}, budget={"maxTrials": 1}, trial={"maxFailures": 2})
    # Checkpoint every 3 iterations; every attempt fails 4 iterations after it starts.
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic, checkpoint_every=3,
                    faults=lambda name, attempt, it: "error" if it == [4, 7, 10][attempt] else None)
    sim.run()
    launches = of_type(sim.log, LaunchTrial)
    assert [(d.attempt, d.start_iteration, d.checkpoint) for d in launches] == [
        (0, 0, None), (1, 3, "sim://exp-0/3"), (2, 6, "sim://exp-0/6")]
    assert launches[1].last_result_seq == 2 and launches[2].last_result_seq == 5   # seqs continue
    trial = runner.trials["exp-0"]
    assert trial.phase is TrialPhase.FAILED and trial.failures == 3 and trial.reason == "Error"
    assert [f["attempt"] for f in trial.failure_log] == [0, 1, 2]
    assert runner.finished.phase == "Failed"        # no trial ever reported a usable result to completion


def test_cluster_faults_retry_without_counting_failures():
    spec = make_spec(scheduler={"maxIterations": 6}, budget={"maxTrials": 1}, trial={"maxFailures": 0})
    runner, sim = run(spec, faults=lambda n, attempt, it: "cluster" if attempt < 3 and it == 2 else None)
    trial = runner.trials["exp-0"]
    assert trial.phase is TrialPhase.SUCCEEDED and trial.failures == 0 and trial.attempt == 3
    assert [f["reason"] for f in trial.failure_log] == ["ClusterFault"] * 3


def test_duplicate_and_out_of_order_results_are_recorded_once():
    runner = make_runner(make_spec(budget={"maxTrials": 1}))
    launch = of_type(runner.step(1.0), LaunchTrial)[0]
    name = launch.name
    for seq, iteration in [(0, 1), (1, 2), (1, 2), (0, 1), (2, 3)]:
        runner.on_trial_result(name, Result(seq, iteration, {"loss": 1.0 / iteration}, 2.0), 2.0)
    trial = runner.trials[name]
    assert [h["iteration"] for h in trial.history] == [1, 2, 3] and trial.last_seq == 2
    # A late result from an earlier attempt is dropped too.
    runner.on_trial_result(name, Result(3, 4, {"loss": 0.1}, 2.0, attempt=7), 2.0)
    assert len(trial.history) == 3


def test_results_after_a_stop_decision_are_ignored():
    runner = make_runner(make_spec(budget={"maxTrials": 2, "parallelism": 2}))
    runner.step(1.0)
    assert of_type(runner.request_stop("exp-0", 2.0), StopTrial)[0].reason == "StopRequested"
    assert runner.on_trial_result("exp-0", Result(0, 1, {"loss": 0.0}, 3.0), 3.0) == []
    assert runner.trials["exp-0"].history == [] and runner.summary(3.0).best_trial is None
    assert runner.on_trial_completed("exp-0", 3.0) == [] and runner.on_trial_errored("exp-0", "x", 3.0) == []


def test_max_iterations_and_completion_without_metric():
    spec = make_spec(scheduler={"maxIterations": 3}, budget={"maxTrials": 2, "parallelism": 2})
    runner = make_runner(spec)
    runner.step(0.0)
    for seq, it in enumerate((1, 2, 3)):
        out = runner.on_trial_result("exp-0", Result(seq, it, {"loss": 0.5}, 1.0), 1.0)
    assert out == [StopTrial("exp-0", TrialPhase.SUCCEEDED, "MaxIterationsReached", "reached maxIterations 3")]
    runner.on_trial_result("exp-1", Result(0, 1, {"accuracy": 0.5}, 1.0), 1.0)
    done = runner.on_trial_completed("exp-1", 2.0)
    assert done[0].phase is TrialPhase.SUCCEEDED and "without reporting loss" in done[0].message
    assert runner.finished.reason == "MaxTrialsReached"


def test_max_duration_stops_running_trials_and_finishes():
    spec = make_spec(budget={"maxTrials": 50, "parallelism": 3, "maxDuration": "30s"})
    runner, sim = run(spec)
    assert runner.finished.reason == "MaxDurationReached" and sim.now == 30
    assert "maxDuration 30s reached" in runner.finished.message
    assert not sim.running and all(t.phase.is_terminal for t in runner.trials.values())
    assert {t.reason for t in runner.trials.values()} == {"ExperimentFinished"}


def test_grid_exhaustion_finishes_before_max_trials():
    spec = make_spec(searchSpace={"x": {"choice": [0.1, 0.2, 0.3]}}, search={"algorithm": "grid"},
                     scheduler={"maxIterations": 2}, budget={"maxTrials": 10, "parallelism": 2})
    runner, sim = run(spec)
    assert runner.finished.reason == "SearchSpaceExhausted" and runner.summary(sim.now).created == 3
    assert "all 3 grid points tried" in runner.finished.message


def test_queued_until_resources_free_with_reason():
    spec = make_spec(scheduler={"maxIterations": 3}, budget={"maxTrials": 4, "parallelism": 4},
                     trial={"resources": {"cpu": 2}})
    ledger = cpu_ledger(4, node_types=[Resources(cpu=4)])
    runner = make_runner(spec, ledger)
    first = runner.step(0.0)
    assert len(of_type(first, LaunchTrial)) == 2
    queued = of_type(first, TrialPhaseChanged)
    assert [d.phase for d in queued] == [TrialPhase.QUEUED] * 2
    assert queued[0].message == ("waiting for 2 CPU of the cluster's 4: in use, or kept for requests ahead "
                                 "in line (fair sharing); scale-up requested")
    assert runner.summary(0.0).queue_reason == queued[0].message
    assert ledger.waiting_bundles() == [Resources(cpu=2)] * 2
    assert runner.step(1.0) == []          # no change, no write
    sim = Simulator(runner, quadratic, now=1.0)
    sim.apply(first)
    sim.run(100)
    assert runner.finished.reason == "MaxTrialsReached" and ledger.used() == Resources()
    assert ledger.waiting_bundles() == []


def test_infeasible_trial_fails_fast_with_the_largest_node():
    spec = make_spec(budget={"maxTrials": 5}, trial={"resources": {"cpu": 1, "gpu": 8}})
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=8, gpu=1), [Resources(cpu=8, gpu=1)], [Resources(cpu=8, gpu=1)])
    runner = make_runner(spec, ledger)
    decisions = runner.step(0.0)
    stop = of_type(decisions, StopTrial)[0]
    assert (stop.phase, stop.reason) == (TrialPhase.FAILED, "Infeasible")
    assert stop.message == "needs 8 GPU per bundle; the largest node type offers 1 GPU"
    assert runner.finished.phase == "Failed" and runner.finished.reason == "Infeasible"


def test_queue_timeout_fails_the_trial():
    spec = make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 4}, "queueTimeout": "10s"})
    ledger = cpu_ledger(4)
    runner = make_runner(spec, ledger)
    runner.step(0.0)
    assert runner.trials["exp-1"].phase is TrialPhase.QUEUED
    assert runner.step(9.0) == []
    stop = of_type(runner.step(10.0), StopTrial)
    assert stop[0].reason == "QueueTimeout" and "queued for 10s (queueTimeout 10s): waiting for 4 CPU" in stop[0].message
    assert not ledger.is_waiting("exp/exp-1")


def test_two_experiments_share_a_ledger_fairly():
    ledger = cpu_ledger(2)
    spec = make_spec(scheduler={"maxIterations": 4}, budget={"maxTrials": 4, "parallelism": 2})
    a, b = make_runner(spec, ledger, name="a"), make_runner(spec, ledger, name="b")
    sims = [Simulator(a, quadratic), Simulator(b, quadratic)]
    launches = []                      # (tick, trial) across both experiments
    tick = 0
    while not (a.finished and b.finished):
        tick += 1
        for sim in sims:
            before = len(sim.log)
            sim.tick()
            launches += [(tick, d.name) for d in sim.log[before:] if isinstance(d, LaunchTrial)]
            assert ledger.used().cpu <= 2 and ledger.free().cpu >= 0
        assert tick < 200
    order = [name for _, name in launches]
    # a took both CPUs first; the first CPU freed went to b (holding none), and from then
    # on each held one (fair sharing, core/fair_share.py), a's and b's launches alternating.
    assert order[:3] == ["a-0", "a-1", "b-0"]
    assert [name[0] for name in order[2:7]] == list("babab")
    assert a.finished.reason == b.finished.reason == "MaxTrialsReached" and ledger.used() == Resources()


def test_request_stop_of_pending_and_running_trials():
    spec = make_spec(budget={"maxTrials": 3, "parallelism": 3}, trial={"resources": {"cpu": 1}})
    ledger = cpu_ledger(1)
    runner = make_runner(spec, ledger)
    runner.step(0.0)
    assert runner.trials["exp-0"].phase is TrialPhase.RUNNING and runner.trials["exp-2"].phase is TrialPhase.QUEUED
    runner.request_stop("exp-2", 1.0)
    assert not ledger.is_waiting("exp/exp-2") and runner.trials["exp-2"].phase is TrialPhase.STOPPED
    runner.request_stop("exp-0")           # the controller may not pass a clock
    assert ledger.used() == Resources() and runner.trials["exp-0"].reason == "StopRequested"
    assert of_type(runner.step(2.0), LaunchTrial)[0].name == "exp-1"


def test_summary_has_fixed_size_and_the_trial_table_is_fairly_truncated():
    from types import SimpleNamespace

    from kubetune.controller import table
    spec = make_spec(scheduler={"type": "asha", "maxIterations": 9}, budget={"maxTrials": 60, "parallelism": 6})
    runner, sim = run(spec, max_ticks=15)
    summary = runner.summary(sim.now)
    assert set(summary.counts) == {p.value for p in TrialPhase}
    # the one trial table (`kubetune run`, the demo) of the runner's live trials
    rows, hidden = table.trial_rows(table.live_trials(SimpleNamespace(runner=runner), None), mode="min", max_rows=8)
    assert len(rows) == 8 and hidden == len(runner.trials) - 8 > 0
    phases = [row[1] for row in rows]
    running = sum(trial.phase is TrialPhase.RUNNING for trial in runner.trials.values())
    assert running and phases[:running] == ["Running"] * running   # live trials not buried
    assert {"Stopped", "Succeeded"} & set(phases[running:])          # then the finished ones, best first
    finished = [float(row[3]) for row in rows[running:] if row[1] in ("Stopped", "Succeeded")]
    assert finished == sorted(finished)


def test_ledger_owner_prefix_and_trial_name_lists():
    ledger = cpu_ledger(1)
    runner = make_runner(make_spec(budget={"maxTrials": 2, "parallelism": 2}), ledger, owner="ns/exp/")
    runner.step(0.0)
    assert ledger.holds("ns/exp/exp-0") and ledger.is_waiting("ns/exp/exp-1")
    assert runner.active_trials() == ["exp-0", "exp-1"] and runner.running_trials() == ["exp-0"]
    runner.stop_all(1.0)
    assert runner.active_trials() == [] and ledger.used() == Resources() and not ledger.waiting_bundles()


def test_a_run_longer_than_trial_timeout_fails_its_trial_without_retry_and_frees_its_slot():
    spec = make_spec(budget={"maxTrials": 3, "parallelism": 1},
                     trial={"resources": {"cpu": 1}, "timeout": "30s", "maxFailures": 5})
    assert spec.trial.timeout_s == 30.0
    ledger = cpu_ledger(1)
    runner = make_runner(spec, ledger)
    assert [d.name for d in of_type(runner.step(0.0), LaunchTrial)] == ["exp-0"]
    runner.on_trial_result("exp-0", Result(seq=0, iteration=1, metrics={"loss": 0.5}, timestamp=1.0), 1.0)
    assert of_type(runner.step(29.0), StopTrial) == []
    decisions = runner.step(30.0)
    (stop,) = of_type(decisions, StopTrial)
    assert (stop.name, stop.phase, stop.reason) == ("exp-0", TrialPhase.FAILED, "TimedOut")
    assert "ran for 30s, longer than spec.trial.timeout 30s; not retried" in stop.message
    assert [d.name for d in of_type(decisions, LaunchTrial)] == ["exp-1"]   # its CPU went to the next
    trial = runner.trials["exp-0"]
    assert trial.attempt == 0 and trial.failure_log[-1]["reason"] == "TimedOut"
    # each run has its own clock: exp-1 started at 30s
    assert of_type(runner.step(59.0), StopTrial) == []
    assert [s.name for s in of_type(runner.step(60.0), StopTrial)] == ["exp-1"]


def test_the_run_clock_survives_an_operator_restart():
    from kubetune.controller import render
    spec = make_spec(budget={"maxTrials": 1}, trial={"timeout": "1m"})
    runner = make_runner(spec)
    runner.step(100.0)
    trial = runner.trials["exp-0"]
    persisted = {"metadata": {"name": trial.name}, "spec": {"index": trial.index, "parameters": trial.params},
                 "status": render.trial_status(trial)}          # what the Trial resource holds
    restarted = make_runner(spec)
    restarted.restore([render.trial_record(persisted)])
    assert of_type(restarted.step(159.0), StopTrial) == []
    assert [s.reason for s in of_type(restarted.step(160.0), StopTrial)] == ["TimedOut"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_only_non_finite_objectives_say_so_in_the_message(value):
    """Every trial reported the objective, but never a finite value: the message a user
    reads says exactly that (not that nothing was reported) and what to do."""
    spec = make_spec(scheduler={"maxIterations": 3}, budget={"maxTrials": 3, "parallelism": 3})
    runner, sim = run(spec, curve=lambda params, t: value)
    finished = runner.finished
    assert finished.phase == "Failed"
    message = finished.message
    assert "no trial reported" not in message, message
    assert "every value the 3 trials reported was NaN or ±Infinity" in message, message
    assert "a non-finite value never counts as best" in message, message
    assert "narrow the search space" in message, message


def test_a_trial_that_never_reported_still_says_so():
    spec = make_spec(scheduler={"maxIterations": 3}, budget={"maxTrials": 2, "parallelism": 2})
    runner, sim = run(spec, curve=lambda params, t: None)
    assert "no trial reported" in runner.finished.message, runner.finished.message


def test_queue_timeout_and_queue_seconds_count_from_the_first_wait_across_a_restart():
    """status.queuedSince is read back: an operator restarted every few seconds (a crash
    loop) cannot keep a trial Queued past its queueTimeout, and the wait before a restart
    is in usage.queueSeconds when it starts."""
    from kubetune.controller import render
    spec = make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 4}, "queueTimeout": "10s"})
    runner = make_runner(spec, cpu_ledger(4))
    runner.step(0.0)
    assert runner.trials["exp-1"].phase is TrialPhase.QUEUED

    def restarted():
        again = make_runner(spec, cpu_ledger(4))
        again.restore(records_of(runner))
        return again

    assert restarted().step(9.0) == []
    stop = of_type(restarted().step(10.0), StopTrial)
    assert [(s.name, s.reason) for s in stop] == [("exp-1", "QueueTimeout")]
    assert "queued for 10s" in stop[0].message

    again = restarted()
    again.on_trial_completed("exp-0", 6.0)
    again.step(6.0)
    assert again.trials["exp-1"].phase is TrialPhase.RUNNING
    assert render.trial_status(again.trials["exp-1"])["usage"]["queueSeconds"] == 6.0
    assert "queuedSince" not in render.trial_status(again.trials["exp-1"])


def test_a_queued_trials_wait_ends_with_it_and_restarts_after_a_suspend_across_a_restart():
    """queuedSince is a Queued trial's: a trial that ends Queued (QueueTimeout) carries none,
    and one restored while suspended waits anew once resumed (as a live suspend has it)."""
    from kubetune.controller import render
    spec = make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 4}, "queueTimeout": "10s"})
    runner = make_runner(spec, cpu_ledger(4))
    runner.step(0.0)
    assert render.trial_status(runner.trials["exp-1"])["queuedSince"] == "1970-01-01T00:00:00.000000Z"
    persisted = records_of(runner)
    runner.step(10.0)
    ended = render.trial_status(runner.trials["exp-1"])
    assert (ended["phase"], ended["reason"]) == ("Failed", "QueueTimeout") and "queuedSince" not in ended

    suspended = make_spec(budget={"maxTrials": 2, "parallelism": 2}, suspend=True,
                          trial={"resources": {"cpu": 4}, "queueTimeout": "10s"})
    again = make_runner(suspended, cpu_ledger(4))
    again.restore(persisted)
    again.step(50.0)
    again.on_spec_changed(spec, 100.0)
    assert again.step(109.0) == [] and again.trials["exp-1"].phase is TrialPhase.QUEUED
    assert [s.reason for s in of_type(again.step(110.0), StopTrial)] == ["QueueTimeout"]


def test_a_trial_queued_by_an_older_operator_is_written_once_with_its_queued_since():
    """Queued before status.queuedSince existed: its first try after the restart, though the
    reason is the same, is a change to write (else each restart would reset the clock)."""
    from kubetune.controller import render
    spec = make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 4}})
    runner = make_runner(spec, cpu_ledger(4))
    runner.step(0.0)
    again = make_runner(spec, cpu_ledger(4))
    again.restore(records_of(runner, without=("queuedSince",)))
    assert [(d.name, d.phase) for d in of_type(again.step(5.0), TrialPhaseChanged)] == [("exp-1", TrialPhase.QUEUED)]
    assert render.trial_status(again.trials["exp-1"])["queuedSince"] == "1970-01-01T00:00:05.000000Z"
    assert again.step(6.0) == []
