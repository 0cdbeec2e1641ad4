"""A trial's room passes to the next trial of its Experiment, out of turn, so that trial
starts on the ended one's warm pooled worker (core/warm_room.py, issue 26 cause 2), and
only within the bounds: a few times in a row, never past a higher priority, never while
Experiments are being built, and never kept beyond the runner's step.

Most tests: a ledger with one CPU left, one trial's worth, for ``a`` and ``b`` (in
another namespace).  ``a`` runs; ``b`` waits first in line for the same CPU, since a's
namespace holds another (a neighbour's): the fair line's turn is b's.  ``b`` was granted
more trials before than ``a`` was, or no room would pass (they go in rounds)."""
from __future__ import annotations

import pytest

from kubetune.core.resources import ResourceLedger, Resources
from kubetune.core.runner import TrialRunner
from kubetune.core.types import LaunchTrial, Result, TrialPhase
from unit_helpers import make_runner, make_spec, of_type, records_of

CPU = [Resources(cpu=1)]
B_TRIAL = "nb/b/b-0"
NEIGHBOUR = "ns/z/z-0"          # a's namespace, another Experiment: holds a CPU throughout
HELD = Resources(cpu=1)         # what the neighbour holds


def ledger_of_one_cpu(passes: int) -> ResourceLedger:
    ledger = ResourceLedger(warm_passes=passes)
    ledger.set_capacity(Resources(cpu=2))
    assert ledger.try_acquire(NEIGHBOUR, CPU)
    return ledger


def experiment_a(ledger: ResourceLedger, trials: int = 10, max_failures: int = 0, **sections):
    spec = make_spec(budget={"maxTrials": trials, "parallelism": 1},
                     trial={"resources": {"cpu": 1}, "maxFailures": max_failures}, **sections)
    return make_runner(spec, ledger, name="a", owner="ns/a/")


def served(ledger: ResourceLedger, owner: str, times: int) -> None:
    """``owner``'s Experiment was granted ``times`` trials before (each ran and ended)."""
    for _ in range(times):
        assert ledger.try_acquire(owner, CPU)
        ledger.release(owner)


def running_a_and_waiting_b(passes: int, trials: int = 10, b_served: int = 10, **sections):
    """b ran ``b_served`` trials before: more than a, so a may pass rooms (they go in rounds)."""
    ledger = ledger_of_one_cpu(passes)
    served(ledger, B_TRIAL, b_served)
    a = experiment_a(ledger, trials, **sections)
    (first,) = launched(a.step(0.0))
    ledger.set_waiting(B_TRIAL, CPU)
    assert not ledger.try_acquire(B_TRIAL, CPU)      # the CPU is a's: b waits, first in line
    return ledger, a, first


def launched(decisions) -> list[str]:
    return [d.name for d in of_type(decisions, LaunchTrial)]


def finish(runner, name: str, now: float) -> list:
    """``name`` reports one result and its function returns; then the runner's step."""
    runner.on_trial_launched(name, now)
    runner.on_trial_result(name, Result(0, 1, {"loss": 1.0}, now), now)
    return runner.on_trial_completed(name, now) + runner.step(now)


def a_trials_before_b_gets_the_cpu(ledger, a, first) -> int:
    """How many of ``a``'s trials start in a row, each in the room of the one before,
    before ``b`` gets the CPU."""
    starts, current, now = 1, first, 1.0
    while True:
        started = launched(finish(a, current, now))
        if not started:
            assert ledger.try_acquire(B_TRIAL, CPU), "the room went neither to a nor to b"
            return starts
        assert not ledger.try_acquire(B_TRIAL, CPU)
        (current,) = started
        starts, now = starts + 1, now + 1.0


def test_a_room_passes_to_the_next_trial_of_its_experiment_at_most_warm_passes_times():
    ledger, a, first = running_a_and_waiting_b(passes=3)
    assert a_trials_before_b_gets_the_cpu(ledger, a, first) == 1 + 3
    assert ledger.work["passed_on"] == 3
    # each pass was a grant, counted in the fair line's tie-breaks
    assert ledger._served["ns/a/"] == 4 and ledger._served["ns"] == 4 + 1 and ledger._served["nb/b/"] == 10 + 1


def test_a_room_passes_only_while_no_experiment_granted_fewer_trials_waits():
    """Experiments go in rounds: b, granted 2 trials before, waits; a passes rooms while it
    was granted no more than b (its first trial and two passes), then b gets the CPU."""
    ledger, a, first = running_a_and_waiting_b(passes=3, b_served=2)
    assert a_trials_before_b_gets_the_cpu(ledger, a, first) == 3
    ledger, a, first = running_a_and_waiting_b(passes=3, b_served=0)
    assert a_trials_before_b_gets_the_cpu(ledger, a, first) == 1


def test_without_passes_the_room_goes_to_whoever_is_first_in_line():
    ledger, a, first = running_a_and_waiting_b(passes=0)
    assert a_trials_before_b_gets_the_cpu(ledger, a, first) == 1
    assert ledger.work["passed_on"] == 0


def test_a_room_never_passes_over_a_higher_priority_waiting():
    ledger, a, first = running_a_and_waiting_b(passes=3)
    ledger.set_waiting(B_TRIAL, CPU, priority=1)
    assert not launched(finish(a, first, 1.0))
    assert ledger.try_acquire(B_TRIAL, CPU, priority=1)


def test_a_room_never_passes_while_experiments_are_being_built():
    """Everyone's first trial comes before anybody's next (fair_share.kept_for_starting)."""
    ledger, a, first = running_a_and_waiting_b(passes=3)
    ledger.starting("ns/c/")
    assert not launched(finish(a, first, 1.0))
    assert not ledger.holds("ns/a/" + first) and ledger.used() == HELD


def ended_and_kept():
    """``a``'s trial ended in the poll, its room kept; nobody waited then."""
    ledger = ledger_of_one_cpu(3)
    a = experiment_a(ledger)
    (first,) = launched(a.step(0.0))
    a.on_trial_launched(first, 0.0)
    a.on_trial_result(first, Result(0, 1, {"loss": 1.0}, 1.0), 1.0)
    a.on_trial_completed(first, 1.0)
    assert ledger.holds("ns/a/" + first), "kept"
    return ledger, a


@pytest.mark.parametrize("arrives", ["a higher priority", "an Experiment being built"])
def test_the_bounds_are_asked_again_when_the_room_would_pass(arrives):
    """Between the poll that kept the room and the step that would pass it, the controller
    awaits (the ended trial's writes, its stop): another controller runs meanwhile."""
    ledger, a = ended_and_kept()
    if arrives == "a higher priority":
        ledger.set_waiting("ns/hi/hi-0", CPU, priority=5)
        assert not launched(a.step(2.0)) and ledger.used() == HELD, "the room went back to the line"
    else:
        ledger.starting("ns/c/")
        # back to the line, where a, holding nothing now, may have it (a first trial's due)
        assert launched(a.step(2.0)) == ["a-1"]
    assert ledger.work["passed_on"] == 0


def test_a_passed_room_stays_on_the_node_its_warm_worker_is_on():
    """The ledger must not record the successor on another node: it would then grant the
    node the worker is on to a trial Ray cannot place beside it."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=5, gpu=1), [Resources(cpu=1), Resources(cpu=4, gpu=1)])
    assert ledger.try_acquire("ns/c/c-0", CPU) and ledger.try_acquire("ns/a/a-0", CPU)   # node 0, node 1
    ledger.release("ns/c/c-0")
    assert ledger.may_pass_on("ns/a/a-0", 0) and ledger.pass_on("ns/a/a-0", "ns/a/a-1", CPU)
    assert ledger._held["ns/a/a-1"] == [(1, Resources(cpu=1))]
    assert not ledger.try_acquire("ns/g/g-0", [Resources(cpu=4, gpu=1)]), "node 1 is not whole"


def test_a_room_passes_only_to_a_request_of_the_same_shape():
    ledger = ledger_of_one_cpu(3)
    assert ledger.try_acquire("ns/a/a-0", CPU)
    assert not ledger.pass_on("ns/a/a-0", "ns/a/a-1", [Resources(cpu=0.5)])
    assert ledger.holds("ns/a/a-0") and not ledger.holds("ns/a/a-1")


def test_a_request_woken_for_free_room_that_takes_a_passed_room_instead_wakes_the_next():
    """Otherwise the free room waits for a capacity refresh with a request that fits it."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=4))
    woken = []
    for experiment in ("x/a/", "y/b/"):
        ledger.watch(experiment, lambda experiment=experiment: woken.append(experiment))
    served(ledger, "y/b/b", 3)
    for owner in ("x/a/r", "y/c/c1", "y/c/c2", "y/c/c3"):
        assert ledger.try_acquire(owner, CPU)
    for owner in ("x/a/q", "y/b/b"):
        ledger.set_waiting(owner, CPU)
    ledger.release("y/c/c1")    # a CPU free: x/a/q is first in line (x holds less than y), and woken
    assert woken == ["x/a/"]
    assert ledger.may_pass_on("x/a/r", 0) and ledger.pass_on("x/a/r", "x/a/q", CPU)
    assert woken == ["x/a/", "y/b/"] and ledger.try_acquire("y/b/b", CPU)


def test_a_runner_the_controller_builds_and_then_attaches_to_the_ledger_passes_rooms():
    """The controller replays an Experiment without a ledger and attaches the cluster's
    after (controller/restore.py): fresh, and restored with a trial running."""
    spec = make_spec(budget={"maxTrials": 10, "parallelism": 1}, trial={"resources": {"cpu": 1}})
    fresh = TrialRunner(spec, experiment="a", start_time=0.0, ledger=None, owner="ns/a/")
    fresh.restore([])
    ledger = ledger_of_one_cpu(3)
    fresh.attach_ledger(ledger)
    (first,) = launched(fresh.step(0.0))
    restored = TrialRunner(spec, experiment="a", start_time=0.0, ledger=None, owner="ns/a/")
    fresh.on_trial_launched(first, 0.0)
    restored.restore(records_of(fresh))
    ledger = ledger_of_one_cpu(3)
    served(ledger, B_TRIAL, 10)
    restored.attach_ledger(ledger)
    assert ledger.holds("ns/a/" + first)
    ledger.set_waiting(B_TRIAL, CPU)
    assert len(launched(finish(restored, first, 1.0))) == 1 and ledger.work["passed_on"] == 1
    restored.close()
    assert ledger.used() == HELD + Resources(cpu=1), "the passed room is held by the running trial"


def test_the_last_trial_s_room_is_not_kept():
    """Its Experiment's last trial ended: nothing more to launch, so b gets the CPU."""
    ledger, a, first = running_a_and_waiting_b(passes=3, trials=1)
    finish(a, first, 1.0)
    assert a.finished is not None
    assert ledger.try_acquire(B_TRIAL, CPU)


def test_a_room_kept_on_a_result_outside_a_step_goes_back_when_the_experiment_finishes_there():
    """A result that finishes the Experiment (its goal reached) ends the trial outside any
    step: the room does not wait for a step that a finished Experiment never runs."""
    ledger, a, first = running_a_and_waiting_b(passes=3, objective={"metric": "loss", "mode": "min", "goal": 2.0})
    a.on_trial_launched(first, 1.0)
    a.on_trial_result(first, Result(0, 1, {"loss": 1.0}, 1.0), 1.0)
    assert a.finished is not None, "the goal was reached"
    assert ledger.try_acquire(B_TRIAL, CPU)


def test_a_failed_run_s_room_does_not_pass_its_worker_may_be_gone():
    ledger, a, first = running_a_and_waiting_b(passes=3)     # maxFailures 0: it fails, the next is made
    a.on_trial_launched(first, 1.0)
    decisions = a.on_trial_errored(first, "worker died", 1.0) + a.step(1.0)
    assert a.trials[first].phase is TrialPhase.FAILED and len(a.trials) == 2
    assert not launched(decisions) and ledger.try_acquire(B_TRIAL, CPU)


def test_a_deleted_experiment_keeps_no_room():
    ledger, a, first = running_a_and_waiting_b(passes=3)
    a.on_trial_launched(first, 1.0)
    a.stop_all(1.0)
    assert ledger.try_acquire(B_TRIAL, CPU)


def test_a_room_kept_when_the_controller_stops_goes_back():
    """The controller stops (close) between the poll that kept a room and any step."""
    ledger, a = ended_and_kept()
    a.close()
    assert ledger.used() == HELD


def test_rooms_kept_in_one_poll_pass_to_as_many_launches():
    """Two trials end in one poll: both rooms pass, one to each next trial."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=2))
    served(ledger, B_TRIAL, 10)
    spec = make_spec(budget={"maxTrials": 10, "parallelism": 2}, trial={"resources": {"cpu": 1}})
    a = make_runner(spec, ledger, name="a", owner="ns/a/")
    ended = launched(a.step(0.0))
    ledger.set_waiting(B_TRIAL, CPU)
    for name in ended:
        a.on_trial_launched(name, 0.0)
        a.on_trial_result(name, Result(0, 1, {"loss": 1.0}, 1.0), 1.0)
        a.on_trial_completed(name, 1.0)
    assert len(launched(a.step(1.0))) == 2 and ledger.work["passed_on"] == 2
    assert not ledger.try_acquire(B_TRIAL, CPU)


def test_a_pbt_exploit_relaunches_in_its_own_room_while_another_experiment_waits():
    """A PBT exploit pauses a trial and relaunches it at once from the donor's checkpoint
    (runner_events._pause): its room, kept, is its own again, not b's (it would start
    cold, queued behind b)."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=4))
    served(ledger, B_TRIAL, 10)
    spec = make_spec(scheduler={"type": "pbt", "maxIterations": 50, "perturbationInterval": 2},
                     budget={"maxTrials": 4, "parallelism": 4}, trial={"resources": {"cpu": 1}})
    a = make_runner(spec, ledger, name="a", owner="ns/a/")
    names = launched(a.step(0.0))
    ledger.set_waiting(B_TRIAL, CPU)
    out = []
    for seq, iteration in enumerate((1, 2)):
        for name, loss in zip(names, (0.1, 0.2, 0.3, 0.9)):
            a.on_trial_launched(name, 0.0) if seq == 0 else None
            location = f"/store/ns/a/{name}/checkpoint-{iteration:06d}"
            out += a.on_trial_result(name, Result(seq, iteration, {"loss": loss}, 1.0, location, 0), 1.0)
    assert launched(out) == [names[3]], "the exploit relaunched at once"
    assert ledger.holds("ns/a/" + names[3]) and ledger.work["passed_on"] == 1
    assert not ledger.try_acquire(B_TRIAL, CPU)


def test_a_kept_room_the_step_does_not_launch_into_goes_back_at_the_step_s_end():
    """Kept when its trial ended (more trials to come), but the step launches nothing:
    the budget is used up while another trial runs on, so the Experiment is not finished."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=2))
    served(ledger, B_TRIAL, 10)
    spec = make_spec(budget={"maxTrials": 10, "parallelism": 2, "cpuHours": 0.001}, trial={"resources": {"cpu": 1}})
    a = make_runner(spec, ledger, name="a", owner="ns/a/")
    first, second = launched(a.step(0.0))
    ledger.set_waiting(B_TRIAL, CPU)
    a.on_trial_launched(first, 0.0)
    a.on_trial_launched(second, 0.0)
    assert a.on_trial_usage(first, 0, 0.0, 10.0)       # 10 CPU-seconds: more than 3.6
    a.on_trial_result(first, Result(0, 1, {"loss": 1.0}, 10.0), 10.0)
    a.on_trial_completed(first, 10.0)
    assert ledger.holds("ns/a/" + first), "kept for a launch"
    assert not launched(a.step(10.0)) and a.finished is None
    assert ledger.try_acquire(B_TRIAL, CPU)


def test_a_timed_out_run_s_room_does_not_pass_its_worker_hung():
    ledger = ledger_of_one_cpu(3)
    spec = make_spec(budget={"maxTrials": 10, "parallelism": 1}, trial={"resources": {"cpu": 1}, "timeout": "30s"})
    a = make_runner(spec, ledger, name="a", owner="ns/a/")
    (first,) = launched(a.step(0.0))
    a.on_trial_launched(first, 0.0)
    ledger.set_waiting(B_TRIAL, CPU)
    assert not launched(a.step(40.0)) and a.trials[first].reason == "TimedOut"
    assert ledger.work["passed_on"] == 0 and ledger.try_acquire(B_TRIAL, CPU)


def test_a_trial_ending_after_the_controller_stopped_keeps_no_room():
    """No step comes after close(): a room kept then would be held for good."""
    ledger, a, first = running_a_and_waiting_b(passes=3)
    a.close()
    a.on_trial_launched(first, 1.0)
    a.on_trial_result(first, Result(0, 1, {"loss": 1.0}, 1.0), 1.0)
    a.on_trial_completed(first, 1.0)
    assert ledger.used() == HELD


def test_a_trial_of_several_bundles_keeps_no_room():
    """Its actor is its own, never pooled: nothing warm to start the next in."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=2))
    spec = make_spec(budget={"maxTrials": 10, "parallelism": 1}, trial={"resources": {"cpu": 1, "bundles": 2}})
    a = make_runner(spec, ledger, name="a", owner="ns/a/")
    (first,) = launched(a.step(0.0))
    ledger.set_waiting("ns/b/b-0", [Resources(cpu=1)] * 2)
    assert not launched(finish(a, first, 1.0)) and ledger.work["passed_on"] == 0


def test_a_long_run_keeps_no_room_b_would_wait_a_whole_run_per_pass():
    ledger, a, first = running_a_and_waiting_b(passes=3)
    assert not launched(finish(a, first, 3600.0))
    assert ledger.work["passed_on"] == 0 and ledger.try_acquire(B_TRIAL, CPU)


def test_no_more_rooms_are_kept_than_the_step_can_launch_trials():
    """Four trials end in one poll with one trial left to make: one room is kept, three
    go back to the line at once (not at the step's end, after every end's effects)."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=4))
    spec = make_spec(budget={"maxTrials": 5, "parallelism": 4}, trial={"resources": {"cpu": 1}})
    a = make_runner(spec, ledger, name="a", owner="ns/a/")
    for name in launched(a.step(0.0)):
        a.on_trial_launched(name, 0.0)
        a.on_trial_result(name, Result(0, 1, {"loss": 1.0}, 1.0), 1.0)
        a.on_trial_completed(name, 1.0)
    assert ledger.used() == Resources(cpu=1)


def test_a_cluster_fault_s_retry_does_not_get_the_room_back_its_worker_is_gone():
    ledger, a, first = running_a_and_waiting_b(passes=3)
    a.on_trial_launched(first, 1.0)
    assert not launched(a.on_trial_errored(first, "node lost", 1.0, cluster_fault=True) + a.step(1.0))
    assert ledger.work["passed_on"] == 0 and ledger.try_acquire(B_TRIAL, CPU)
