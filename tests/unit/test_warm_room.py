"""A trial's room passes to the next trial of its Experiment, out of turn, so that trial
starts on the ended one's warm pooled worker (core/warm_room.py, issue 26 cause 2), and
only within the bounds: a few times in a row, never past a higher priority, never while
Experiments are being built, and never kept beyond the runner's step.

Two Experiments share a ledger of one CPU, one trial's worth: ``a`` runs, ``b`` waits
first in line for the same CPU."""
from __future__ import annotations

from kubetune.core.resources import ResourceLedger, Resources
from kubetune.core.types import LaunchTrial, Result, TrialPhase
from unit_helpers import make_runner, make_spec, of_type

CPU = [Resources(cpu=1)]
B_TRIAL = "ns/b/b-0"


def ledger_of_one_cpu(passes: int) -> ResourceLedger:
    ledger = ResourceLedger(warm_passes=passes)
    ledger.set_capacity(Resources(cpu=1))
    return ledger


def experiment_a(ledger: ResourceLedger, trials: int = 10, max_failures: int = 0, **sections):
    spec = make_spec(budget={"maxTrials": trials, "parallelism": 1},
                     trial={"resources": {"cpu": 1}, "maxFailures": max_failures}, **sections)
    return make_runner(spec, ledger, name="a", owner="ns/a/")


def running_a_and_waiting_b(passes: int, trials: int = 10, **sections):
    ledger = ledger_of_one_cpu(passes)
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
    assert ledger._served["ns/a/"] == 4 and ledger._served["ns"] == 4 + 1


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
    assert not ledger.holds("ns/a/" + first) and ledger.used() == Resources()


def test_a_kept_room_nobody_launches_into_goes_back_at_the_end_of_the_step():
    """Its Experiment's last trial ended: nothing is launched, so b gets the CPU."""
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


def test_the_room_of_a_paused_trial_that_resumes_at_once_is_its_own_again():
    """The kept room's holder and the launch are the same trial: the ledger cannot pass a
    room to its own holder, so it is released and taken again in line."""
    ledger = ledger_of_one_cpu(3)
    a = experiment_a(ledger)
    (first,) = launched(a.step(0.0))
    owner = "ns/a/" + first
    a._rooms.release(owner, 0, keep=True)
    assert ledger.holds(owner), "kept"
    assert a._rooms.acquire(owner, CPU, 0) and ledger.holds(owner)
    assert ledger.work["passed_on"] == 0


def test_a_kept_room_the_step_does_not_launch_into_goes_back_at_the_step_s_end():
    """Kept when its trial ended (more trials to come), but the step launches nothing:
    the budget is used up while another trial runs on, so the Experiment is not finished."""
    ledger = ResourceLedger(warm_passes=3)
    ledger.set_capacity(Resources(cpu=2))
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
