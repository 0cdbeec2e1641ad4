"""A queued trial its runner will not try leaves the shared ledger's line (issue 26).

Left there, its request (which fits) holds back every request of equal priority behind
it, another Experiment's included, and is never taken: the budget is used up, no slot
is left under ``parallelism``, or the Experiment is deleted and its cleanup waits for
runs to end.  Each case: another Experiment's request waits behind the queued trial
(which is ahead in the fair order: its Experiment holds less), room frees, and the other
Experiment gets it."""
from __future__ import annotations

import asyncio

import pytest

from kubetune.controller.operator_state import CleanupPending, OperatorState
from kubetune.controller.store import MemoryStore
from kubetune.core.resources import Resources
from kubetune.core.types import LaunchTrial, TrialPhase
from kubetune.executors.platform import PlatformRegistry
from kubetune.executors.ray.platform import RayPlatforms
from test_lifecycle_rules import FlakyRay
from unit_helpers import cpu_ledger, make_runner, make_spec, of_type

CPU = [Resources(cpu=1)]
OTHER = "ns/other/other-3"     # another Experiment's trial, of the same (default) priority
THIRD = "ns/third/third-0"     # a third Experiment's, whose end frees room


def full_ledger():
    """6 CPUs: 3 held by the other Experiment, 1 by a third, 2 left for ``e``."""
    ledger = cpu_ledger(6)
    for owner in ("ns/other/other-0", "ns/other/other-1", "ns/other/other-2", THIRD):
        assert ledger.try_acquire(owner, CPU)
    return ledger


def two_running_one_queued(ledger, **budget):
    """An Experiment ``e`` with two trials holding the ledger's last 2 CPUs and a third
    queued, then another Experiment's request queued behind it."""
    spec = make_spec(budget={"maxTrials": 3, "parallelism": 3, **budget}, trial={"resources": {"cpu": 1}})
    runner = make_runner(spec, ledger, name="e", owner="ns/e/")
    launched = [d.name for d in of_type(runner.step(0.0), LaunchTrial)]
    (queued,) = [name for name, t in runner.trials.items() if t.phase is TrialPhase.QUEUED]
    for name in launched:
        runner.on_trial_launched(name, 0.0)
    assert len(launched) == 2 and ledger.is_waiting(f"ns/e/{queued}")
    ledger.set_waiting(OTHER, CPU)
    return runner, launched, queued


def room_goes_to_the_other_experiment(ledger, runner, launched, queued) -> None:
    ledger.release(THIRD)                         # room for one
    assert not ledger.is_waiting(f"ns/e/{queued}"), "a trial that will not be tried holds its place in line"
    assert ledger.try_acquire(OTHER, CPU), ledger.queue_reason(OTHER)


def test_a_queued_trial_leaves_the_line_once_the_budget_is_used_up():
    ledger = full_ledger()
    runner, launched, queued = two_running_one_queued(ledger, cpuHours=0.001)
    # its running trials used more than 3.6 CPU-seconds: nothing more starts, they run on to a report
    assert runner.on_trial_usage(launched[0], 0, 0.0, 10.0)
    runner.step(10.0)
    assert runner.finished is None and runner.trials[launched[1]].phase is TrialPhase.RUNNING
    room_goes_to_the_other_experiment(ledger, runner, launched, queued)


def test_a_queued_trial_leaves_the_line_when_parallelism_is_lowered_below_the_running_trials():
    ledger = full_ledger()
    runner, launched, queued = two_running_one_queued(ledger)
    runner.on_spec_changed(make_spec(budget={"maxTrials": 3, "parallelism": 2}, trial={"resources": {"cpu": 1}}), 5.0)
    assert runner.spec.budget.parallelism == 2 and runner.trials[queued].phase is TrialPhase.QUEUED
    room_goes_to_the_other_experiment(ledger, runner, launched, queued)
    # one of its own runs ends: a slot frees under parallelism and the room with it, so
    # it is tried again and starts
    decisions = runner.on_trial_completed(launched[1], 6.0) + runner.step(6.0)
    assert [d.name for d in of_type(decisions, LaunchTrial)] == [queued]


def test_a_queued_trial_of_a_deleted_experiment_leaves_the_line_while_its_cleanup_waits():
    ledger = full_ledger()
    registry = RayPlatforms("ray://head:10001", lambda address: FlakyRay(unreachable=100))
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: MemoryStore(),
                          checkpoint_storage="")
    body = {"metadata": {"name": "e", "namespace": "ns", "uid": "u1"}, "spec": {}}
    controller = state.controller_for("ns", "e", body)
    runner, launched, queued = two_running_one_queued(ledger)
    controller.ctx.runner = runner

    class WithTrials(MemoryStore):
        async def list_trials(self):
            return [{"metadata": {"name": name}} for name in runner.trials]
    state._store_factory = lambda *_: WithTrials()
    with pytest.raises(CleanupPending):     # Ray unreachable: its runs may still be alive
        asyncio.run(state.delete("ns", "e", body))
    assert ("ns", "e") in state.controllers
    room_goes_to_the_other_experiment(ledger, runner, launched, queued)


class LedgerPlatform:
    """The platform calls a cycle and a launch make, on the test's ledger; ``started``
    records the launches it was asked to start."""

    def __init__(self, ledger):
        self.ledger = ledger
        self.started: list[str] = []

    async def refresh_capacity(self):
        return None

    def launch_waiting(self, request):
        return None

    async def start(self, request):
        self.started.append(request.trial_key)


def controller_of(runner, ledger, poll=None):
    """An Experiment ``e``'s controller driving ``runner``; a cycle's poll is ``poll``, its
    reconcile and its effects do nothing."""
    from kubetune.controller.experiment import ExperimentController
    body = {"metadata": {"name": "e", "uid": "E"}, "spec": {}}
    controller = ExperimentController(namespace="ns", name="e", store=MemoryStore(), registry=None,
                                      body=lambda: body, clock=lambda: 1.0)
    controller.ctx.spec, controller.ctx.runner = runner.spec, runner
    controller.ctx.platform = LedgerPlatform(ledger)

    async def nothing(*_):
        return False
    controller.runs.reconcile = nothing
    controller.effects.apply = nothing
    if poll is not None:
        controller.pump.poll_running = poll
    return controller


def test_a_cycle_under_way_when_its_controller_stops_puts_no_request_back_in_line():
    """stop() takes the queued trials out of the line; a cycle that was awaiting the poll
    then must not step again (that step put them back, with nobody left to try them)."""
    ledger = full_ledger()
    runner, launched, queued = two_running_one_queued(ledger)

    async def poll_then_stop():     # the Experiment deleted while the poll awaited Ray
        controller.stop()
        return True
    controller = controller_of(runner, ledger, poll_then_stop)
    asyncio.run(controller._step_and_poll())
    assert not ledger.is_waiting(f"ns/e/{queued}"), "the stopped controller's cycle put its trial back in line"


def test_the_poll_that_saw_the_stop_puts_no_trial_back_in_line():
    """The poll under way when stop() came hands its updates on, and its events step the
    runner: a queued trial (or a failed one's retry) would ask for room again, with
    nobody left to try it.  The stopped runner asks for none."""
    ledger = full_ledger()
    runner, launched, queued = two_running_one_queued(ledger)

    async def stop_then_step():
        controller.stop()
        assert not ledger.is_waiting(f"ns/e/{queued}")
        assert of_type(runner.step(1.0), LaunchTrial) == []    # as the poll's events step it
        assert not ledger.is_waiting(f"ns/e/{queued}"), "the step after the stop put the trial back in line"
        return True
    controller = controller_of(runner, ledger, stop_then_step)
    asyncio.run(controller._step_and_poll())
    assert not ledger.is_waiting(f"ns/e/{queued}"), "the stopped controller's cycle left its trial in line"


def test_a_retry_polled_after_its_controller_stopped_launches_nothing_and_takes_no_room():
    """A failed trial's update handled after stop() (the cycle was awaiting the poll):
    its retry neither launches nor holds or waits for room in the shared ledger, which
    nobody would give back (and a same-named Experiment created next could not acquire
    its trial's key).  stop() is the controller's; here its runner's part, close()."""
    ledger = cpu_ledger(6)
    spec = make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 1}, "maxFailures": 3})
    runner = make_runner(spec, ledger, name="e", owner="ns/e/")
    launched = [d.name for d in of_type(runner.step(0.0), LaunchTrial)]
    for name in launched:
        runner.on_trial_launched(name, 0.0)
    assert len(launched) == 2
    runner.close()
    ledger.release(f"ns/e/{launched[0]}")        # its run ended: the platform gave its room back
    decisions = runner.on_trial_errored(launched[0], "boom", 1.0) + runner.step(1.0)
    assert of_type(decisions, LaunchTrial) == []
    assert not ledger.holds(f"ns/e/{launched[0]}") and not ledger.is_waiting(f"ns/e/{launched[0]}")


def test_a_launch_applied_after_its_controller_stopped_starts_nothing():
    """stop() came while the cycle applied its decisions (each launch awaits the platform):
    a launch decided before the stop and applied after it starts no run."""
    ledger = cpu_ledger(6)
    spec = make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 1}})
    runner = make_runner(spec, ledger, name="e", owner="ns/e/")
    controller = controller_of(runner, ledger)
    started = controller.ctx.platform.started
    first, second = of_type(runner.step(0.0), LaunchTrial)
    asyncio.run(controller.effects.launch(first))
    assert started == ["ns/e/" + first.name], "the scenario's platform did not start a launch"
    controller.stop()
    asyncio.run(controller.effects.launch(second))
    assert started == ["ns/e/" + first.name], "a launch applied after stop() started a run"
