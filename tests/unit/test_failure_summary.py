"""core/failures.py and the runner: the Experiment's message names the most common trial
failure with a count, and systematic failures end the Experiment early."""
from __future__ import annotations

import pytest

from kubetune.core.failures import FailureTally, failure_class, wrong_type
from kubetune.core.types import LaunchTrial, Result

from unit_helpers import make_runner, make_spec, of_type


@pytest.mark.parametrize("message,kind", [
    ("EntrypointError: cannot load entrypoint 'nope:train': ModuleNotFoundError: No module named 'nope'\nTrace",
     "EntrypointError"),
    ("ZeroDivisionError: division by zero\nTraceback ...", "ZeroDivisionError"),
    ("SystemExit: the function called sys.exit(0); ...", "SystemExit"),
    ("ray.exceptions.RayActorError: The actor died", "RayActorError"),
    ("ImagePullBackOff: Back-off pulling image \"nope:1\"", "ImagePullBackOff"),
    ('cannot create pod exp-0-a0: pods "exp-0-a0" is forbidden: violates PodSecurity "restricted:latest": '
     "privileged", "PodRefused"),
    ('launch failed: ExecutorError: cannot create pod e-1-a0: pods "e-1-a0" is forbidden: violates PodSecurity '
     '"baseline:latest": privileged', "PodRefused"),
    ("attempt 3 of exp-12 timed out", "attempt # of # timed out"),
    ("", "unknown error"),
])
def test_failure_class(message, kind):
    assert failure_class(message) == kind


def test_the_most_common_class_is_named_with_its_count():
    tally = FailureTally()
    tally.ended_otherwise()
    for trial, message in [("e-1", "KeyError: 'x'"), ("e-2", "ZeroDivisionError: division by zero"),
                           ("e-3", "ZeroDivisionError: division by zero")]:
        tally.failed(trial, message)
    assert tally.summary(8) == ("3 of 8 trials failed, most often ZeroDivisionError "
                                "(2; e-2: ZeroDivisionError: division by zero)")
    assert tally.systematic(8) == ""      # a trial ended well first


def test_an_entrypoint_error_is_systematic_at_once():
    tally = FailureTally()
    tally.failed("e-0", "EntrypointError: cannot load entrypoint 'a:b': ModuleNotFoundError: No module named 'a'")
    assert "the entrypoint cannot be loaded" in tally.systematic(10)
    assert "No module named 'a'" in tally.systematic(10)


def test_the_same_class_in_the_first_trials_is_systematic():
    tally = FailureTally()
    tally.failed("e-0", "ValueError: bad")
    tally.failed("e-1", "ValueError: worse")
    assert tally.systematic(10) == ""
    tally.failed("e-2", "ValueError: worst")
    assert tally.systematic(10).startswith("the first 3 trials all failed with ValueError")
    mixed = FailureTally()
    for message in ("ValueError: a", "KeyError: b", "ValueError: c"):
        mixed.failed("e", message)
    assert mixed.systematic(10) == ""


def test_a_wrongly_typed_objective_names_the_type():
    assert "val_loss was reported as a str ('0.3')" in wrong_type([{"val_loss": "0.3"}], "val_loss")
    assert "reported as a bool (True)" in wrong_type([{"val_loss": 1.0}, {"val_loss": True}], "val_loss")
    assert wrong_type([{"other": 1}], "val_loss") == ""


def launch_all(runner, now):
    return [d.name for d in of_type(runner.step(now), LaunchTrial)]


def test_runner_fails_fast_on_an_entrypoint_error():
    runner = make_runner(make_spec(budget={"maxTrials": 10, "parallelism": 2}))
    names = launch_all(runner, 1.0)
    assert len(names) == 2
    runner.on_trial_errored(names[0], "EntrypointError: cannot load entrypoint 'pkg.mod:train': "
                                      "ModuleNotFoundError: No module named 'pkg'\nTraceback...", 2.0)
    assert runner.finished is not None
    assert (runner.finished.phase, runner.finished.reason) == ("Failed", "SystematicFailure")
    assert "No module named 'pkg'" in runner.finished.message
    assert "1 of 2 trials failed, most often EntrypointError (1;" in runner.finished.message
    assert runner.active_trials() == []          # the other trial is stopped, no more start


def test_runner_stops_after_the_first_three_trials_fail_alike():
    runner = make_runner(make_spec(budget={"maxTrials": 10, "parallelism": 1}))
    for now in (1.0, 2.0, 3.0):
        [name] = launch_all(runner, now)
        runner.on_trial_errored(name, "ZeroDivisionError: division by zero\nTraceback...", now + 0.5)
    assert (runner.finished.phase, runner.finished.reason) == ("Failed", "SystematicFailure")
    assert runner.finished.message.startswith("stopped after 3 trials: the first 3 trials all failed with "
                                              "ZeroDivisionError")
    assert "3 of 3 trials failed, most often ZeroDivisionError (3;" in runner.finished.message


def test_a_finished_experiment_names_its_most_common_failure():
    runner = make_runner(make_spec(budget={"maxTrials": 3, "parallelism": 1}))
    [first] = launch_all(runner, 1.0)
    runner.on_trial_result(first, Result(1, 1, {"loss": 0.25}, 1.1, None, 0), 1.1)
    runner.on_trial_completed(first, 1.2)
    for now in (2.0, 3.0):
        [name] = launch_all(runner, now)
        runner.on_trial_errored(name, "SystemExit: the function called sys.exit(0); ...", now + 0.5)
    assert runner.finished.reason == "MaxTrialsReached"
    assert "best loss 0.25" in runner.finished.message
    assert "2 of 3 trials failed, most often SystemExit (2;" in runner.finished.message


def test_an_objective_reported_as_text_fails_the_trial_naming_the_type():
    runner = make_runner(make_spec(budget={"maxTrials": 1}))
    [name] = launch_all(runner, 1.0)
    runner.on_trial_result(name, Result(1, 1, {"loss": "0.3"}, 1.1, None, 0), 1.1)
    runner.on_trial_completed(name, 1.2)
    trial = runner.trials[name]
    assert trial.phase.value == "Failed" and trial.reason == "ObjectiveNotANumber"
    assert "loss was reported as a str ('0.3'), not a number" in trial.message
    assert "most often ObjectiveNotANumber (1;" in runner.finished.message


def test_a_placement_group_larger_than_the_cluster_fails_fast():
    from unit_helpers import cpu_ledger
    from kubetune.core.resources import Resources

    ledger = cpu_ledger(2, nodes=2)
    assert ledger.feasibility([Resources(cpu=1)] * 2) is None
    problem = ledger.feasibility([Resources(cpu=1)] * 1000)
    assert problem == ("needs 1000 bundles, 1000 CPU in all, placed together; the whole cluster (2 nodes) "
                       "offers 2 CPU")
    runner = make_runner(make_spec(trial={"resources": {"cpu": 1, "bundles": 1000}}), ledger=ledger)
    runner.step(1.0)
    assert (runner.finished.phase, runner.finished.reason) == ("Failed", "Infeasible")
    assert "1000 bundles" in runner.finished.message


def waiting_pod(reason: str, started: str = "2026-01-01T00:00:00Z", phase: str = "Pending") -> dict:
    return {"status": {"phase": phase, "startTime": started, "containerStatuses": [
        {"name": "trial", "state": {"waiting": {"reason": reason, "message": f"kubelet says {reason}"}}}]}}


def test_a_container_the_kubelet_cannot_start_is_queued_then_failed():
    from datetime import datetime, timezone
    from kubetune.executors.pods.spec import CONTAINER_WAITING_TIMEOUT_S, container_waiting

    start = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    assert container_waiting(waiting_pod("ImagePullBackOff"), start + 5) == (
        "ImagePullBackOff", "container trial: kubelet says ImagePullBackOff", False)
    reason, message, failed = container_waiting(waiting_pod("CreateContainerConfigError"),
                                                start + CONTAINER_WAITING_TIMEOUT_S + 1)
    assert failed and "the limit is 120s" in message
    assert container_waiting(waiting_pod("InvalidImageName"), start)[2] is True      # at once
    assert container_waiting(waiting_pod("ContainerCreating"), start + 1000) is None  # normal start
    assert container_waiting(waiting_pod("ImagePullBackOff", phase="Failed"), start) is None
    assert failure_class("ImagePullBackOff: container trial: Back-off pulling image") == "ImagePullBackOff"
    tally = FailureTally()
    tally.failed("e-0", "ImagePullBackOff: container trial: Back-off pulling image \"nope:1\"")
    assert "cannot start" in tally.systematic(10)


@pytest.mark.parametrize("checkpoint_every,warns", [(10**9, True), (1, False)])
def test_pbt_whose_function_never_checkpoints_warns(checkpoint_every, warns):
    from kubetune.core.simulate import Simulator
    from unit_helpers import quadratic

    spec = make_spec(scheduler={"type": "pbt", "maxIterations": 20, "perturbationInterval": 2},
                     budget={"maxTrials": 4, "parallelism": 4})
    runner = make_runner(spec)
    Simulator(runner, quadratic, checkpoint_every=checkpoint_every).run()
    warning = runner.scheduler.warning()
    assert bool(warning) is warns, warning
    if warns:
        assert warning.startswith("PBT skipped") and "checkpoint=directory" in warning
