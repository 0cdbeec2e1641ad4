"""Live spec changes, suspend/resume and rebuilding the runner after an operator restart."""
import pytest

from kubetune.core.resources import Resources
from kubetune.core.simulate import Simulator
from kubetune.core.types import CreateTrial, LaunchTrial, PauseTrial, TrialPhase
from unit_helpers import cpu_ledger, make_runner, make_spec, of_type, quadratic, records_of


def test_raising_parallelism_and_max_trials_takes_effect_at_once():
    spec = make_spec(scheduler={"maxIterations": 10}, budget={"maxTrials": 4, "parallelism": 1})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    sim.tick()
    assert len(sim.running) == 1
    more = make_spec(scheduler={"maxIterations": 10}, budget={"maxTrials": 6, "parallelism": 3})
    decisions = runner.on_spec_changed(more, sim.now)
    sim.apply(decisions)
    assert len(of_type(decisions, LaunchTrial)) == 2 and len(sim.running) == 3
    assert runner.spec_rejection == ""
    sim.run()
    assert runner.summary(sim.now).created == 6 and runner.finished.reason == "MaxTrialsReached"


def test_lowering_parallelism_stops_launching_until_below():
    spec = make_spec(scheduler={"maxIterations": 5}, budget={"maxTrials": 8, "parallelism": 4})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    sim.tick()
    assert len(sim.running) == 4
    sim.apply(runner.on_spec_changed(make_spec(scheduler={"maxIterations": 5},
                                               budget={"maxTrials": 8, "parallelism": 2}), sim.now))
    assert len(sim.running) == 4            # running trials are not killed
    while not runner.finished:
        sim.tick()
        if len(sim.running) <= 2:
            break
    for _ in range(50):
        sim.tick()
        assert len(sim.running) <= 2
    assert runner.finished and runner.finished.reason == "MaxTrialsReached"


def test_lowering_max_trials_below_created_is_refused():
    spec = make_spec(scheduler={"maxIterations": 50}, budget={"maxTrials": 10, "parallelism": 5})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    sim.tick()
    runner.on_spec_changed(make_spec(scheduler={"maxIterations": 50}, budget={"maxTrials": 3, "parallelism": 5}), sim.now)
    assert runner.max_trials == 10
    assert runner.spec_rejection == ("spec.budget.maxTrials: cannot lower to 3: 5 trials already exist; "
                                     "set it to 5 or more")
    # Lowering to exactly the created count is fine: no more trials are made.
    runner.on_spec_changed(make_spec(scheduler={"maxIterations": 50}, budget={"maxTrials": 5, "parallelism": 5}), sim.now)
    assert runner.spec_rejection == "" and runner.max_trials == 5
    sim.run()
    assert runner.summary(sim.now).created == 5


def test_changing_the_search_space_mid_run_is_refused_but_budgets_apply():
    runner = make_runner(make_spec(budget={"maxTrials": 4}))
    runner.step(0.0)
    changed = make_spec(searchSpace={"y": {"uniform": [0, 1]}}, budget={"maxTrials": 6})
    runner.on_spec_changed(changed, 1.0)
    assert "spec.searchSpace: cannot change while the experiment runs" in runner.spec_rejection
    assert list(runner.spec.search_space) == ["x"] and runner.max_trials == 6


def test_raising_max_trials_after_finishing_continues_the_experiment():
    spec = make_spec(scheduler={"maxIterations": 2}, budget={"maxTrials": 2})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    sim.run()
    assert runner.finished.reason == "MaxTrialsReached"
    sim.apply(runner.on_spec_changed(make_spec(scheduler={"maxIterations": 2}, budget={"maxTrials": 3}), sim.now))
    assert runner.finished is None
    sim.run()
    assert runner.finished.reason == "MaxTrialsReached" and runner.summary(sim.now).created == 3


def test_suspend_pauses_running_trials_and_resume_continues_from_checkpoints():
    spec = make_spec(scheduler={"maxIterations": 10}, budget={"maxTrials": 4, "parallelism": 2},
                     trial={"resources": {"cpu": 1}})
    ledger = cpu_ledger(2)
    runner = make_runner(spec, ledger)
    sim = Simulator(runner, quadratic, checkpoint_every=2)
    for _ in range(5):
        sim.tick()
    suspended = make_spec(scheduler={"maxIterations": 10}, budget={"maxTrials": 4, "parallelism": 2},
                          trial={"resources": {"cpu": 1}}, suspend=True)
    decisions = runner.on_spec_changed(suspended, sim.now)
    sim.apply(decisions)
    assert [d.reason for d in of_type(decisions, PauseTrial)] == ["Suspended", "Suspended"]
    assert not sim.running and ledger.used() == Resources()
    for _ in range(10):
        sim.tick()
        assert not sim.running and not of_type(sim.log[-3:], CreateTrial)
    assert runner.summary(sim.now).counts["Paused"] == 2 and runner.summary(sim.now).created == 2
    assert runner.spec.suspend and runner.summary(sim.now).finished is None   # suspended, not finished
    resumed = runner.on_spec_changed(make_spec(scheduler={"maxIterations": 10}, trial={"resources": {"cpu": 1}},
                                               budget={"maxTrials": 4, "parallelism": 2}), sim.now)
    sim.apply(resumed)
    relaunches = of_type(resumed, LaunchTrial)
    assert [(d.attempt, d.start_iteration, d.checkpoint) for d in relaunches] == [
        (1, 4, "sim://exp-0/4"), (1, 4, "sim://exp-1/4")]
    assert all(t.reason != "Suspended" for t in runner.trials.values())
    sim.run()
    assert runner.finished.reason == "MaxTrialsReached"
    assert runner.trials["exp-0"].iteration == 10 and runner.trials["exp-0"].phase is TrialPhase.SUCCEEDED


@pytest.mark.parametrize("scheduler", ["fifo", "asha", "hyperband", "median", "pbt"])
def test_restore_mid_run_gives_the_same_total_and_no_repeats(scheduler):
    spec = make_spec(searchSpace={"x": {"uniform": [0, 1]}, "y": {"loguniform": [1e-3, 1]}},
                     search={"algorithm": "tpe", "seed": 4},
                     scheduler={"type": scheduler, "maxIterations": 9, "perturbationInterval": 3},
                     budget={"maxTrials": 24, "parallelism": 4}, trial={"resources": {"cpu": 1}})
    ledger = cpu_ledger(4)
    first = make_runner(spec, ledger)
    sim = Simulator(first, quadratic)
    for _ in range(12):
        sim.tick()
    created_before = first.summary(sim.now).created
    assert 0 < created_before < 24 and sim.running
    records = records_of(first)

    # The operator restarts: a fresh ledger, a fresh runner, the same running trials.
    ledger2 = cpu_ledger(4)
    second = make_runner(spec, ledger2)
    second.restore(records)
    assert ledger2.used() == Resources(cpu=len(sim.running))
    assert second.summary(sim.now).created == created_before
    if scheduler in ("asha", "hyperband"):
        # The pruner's rung bookkeeping is rebuilt from the histories.
        assert second.scheduler._rung_values == first.scheduler._rung_values
    sim.runner = second
    sim.run()
    assert second.finished.reason == "MaxTrialsReached"
    names = [t.name for t in second.trials.values()]
    assert names == [f"exp-{i}" for i in range(24)]
    params = [tuple(sorted(r.params.items())) for r in records_of(second) if r.index >= created_before]
    old = {tuple(sorted(r.params.items())) for r in records}
    assert len(params) == 24 - created_before and not (set(params) & old)
    assert ledger2.used() == Resources()


def test_restore_keeps_failure_counts_and_best_and_resumes_paused_trials():
    spec = make_spec(scheduler={"maxIterations": 6}, budget={"maxTrials": 6, "parallelism": 2, "maxFailedTrials": 5})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic, faults=lambda n, a, it: "error" if n == "exp-0" and it == 2 else None)
    for _ in range(4):
        sim.tick()
    sim.apply(runner.on_spec_changed(make_spec(scheduler={"maxIterations": 6}, suspend=True,
                                               budget={"maxTrials": 6, "parallelism": 2, "maxFailedTrials": 5}), sim.now))
    records = records_of(runner)
    restored = make_runner(make_spec(scheduler={"maxIterations": 6},
                                     budget={"maxTrials": 6, "parallelism": 2, "maxFailedTrials": 5}))
    restored.restore(records)
    assert restored.summary(sim.now).counts["Failed"] == 1
    assert restored.summary(sim.now).best_metric == runner.summary(sim.now).best_metric
    relaunch = of_type(restored.step(sim.now), LaunchTrial)
    assert relaunch and all(d.attempt == 1 for d in relaunch)
    assert all(d.last_result_seq == records[int(d.name.split("-")[1])].last_result_seq for d in relaunch)


def test_a_cluster_fault_is_retried_by_the_next_step_not_from_within_the_error():
    # The controller applies the decisions of on_trial_errored at once: a relaunch from
    # there would fail again while the cluster is down, and recurse (launch -> error ->
    # launch).  The trial waits, Pending/Retrying, and the next step relaunches it.
    runner = make_runner(make_spec(budget={"maxTrials": 1, "parallelism": 1}, trial={"maxFailures": 0}))
    launched = [d for d in runner.step(0.0) if isinstance(d, LaunchTrial)]
    runner.on_trial_launched(launched[0].name, 0.0)
    for attempt in range(1, 4):
        decisions = runner.on_trial_errored(launched[0].name, "launch failed: ConnectionError", float(attempt),
                                            cluster_fault=True)
        assert not any(isinstance(d, LaunchTrial) for d in decisions)
        assert runner.trials[launched[0].name].phase.value == "Pending"
        retry = [d for d in runner.step(float(attempt)) if isinstance(d, LaunchTrial)]
        assert [(d.name, d.attempt) for d in retry] == [(launched[0].name, attempt)]
        runner.on_trial_launched(launched[0].name, float(attempt))
    assert runner.trials[launched[0].name].failures == 0   # cluster faults do not count


def test_a_trial_keeps_its_counted_failures_and_only_the_latest_cluster_faults():
    runner = make_runner(make_spec(budget={"maxTrials": 1, "parallelism": 1}, trial={"maxFailures": 2}))
    name = [d for d in runner.step(0.0) if isinstance(d, LaunchTrial)][0].name
    runner.on_trial_launched(name, 0.0)
    runner.on_trial_errored(name, "ValueError: first", 0.0)              # counted, relaunched at once
    runner.on_trial_launched(name, 0.0)
    for attempt in range(30):                                           # a Ray head restarting, again and again
        runner.on_trial_errored(name, f"node lost {attempt}", 1.0, cluster_fault=True)
        runner.step(1.0)
        runner.on_trial_launched(name, 1.0)
    log = runner.trials[name].failure_log
    assert [e["message"] for e in log if e["reason"] == "Error"] == ["ValueError: first"]
    assert [e["message"] for e in log if e["reason"] == "ClusterFault"] == [f"node lost {i}" for i in range(20, 30)]
    assert runner.trials[name].attempt == 31 and runner.trials[name].failures == 1
