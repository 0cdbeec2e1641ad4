"""Kueue admission as trial states (executors/pods/kueue.py) and the runner's rules for it
(core/admission.py): the admission window, a preemption as a pause, the queue-wait summary.  Pure."""
from __future__ import annotations

import dataclasses

import pytest

from kubetune.core import admission
from kubetune.executors.pods import kueue
from kubetune.core.types import LaunchTrial, PauseTrial, Result, TrialPhase
from kubetune.spec import SpecError
from unit_helpers import make_runner, make_spec, of_type

POD_TEMPLATE = {"spec": {"containers": [{"name": "train", "image": "trainer:1"}]}}


def pod(*, gated: bool = True, queue: str = "tuning", conditions: tuple = (), created: str = "2026-01-01T00:00:00Z"):
    return {"metadata": {"name": "t-0-a0", "uid": "u1", "creationTimestamp": created,
                         "labels": {kueue.QUEUE_LABEL: queue}},
            "spec": {"schedulingGates": [{"name": kueue.ADMISSION_GATE}] if gated else []},
            "status": {"phase": "Pending", "conditions": list(conditions)}}


def test_a_gated_pod_waits_for_admission_in_its_queue():
    state = kueue.admission(pod(), None)
    assert state.waiting == admission.QUEUED and not state.evicted and state.queue_wait_s is None
    assert state.message == "waiting for Kueue admission in queue tuning"
    why = {"status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                      "message": "couldn't assign flavors to pod set main: insufficient quota"}]}}
    assert kueue.admission(pod(), why).message.endswith("insufficient quota")


def test_quota_reserved_with_a_pending_check_is_provisioning():
    workload = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"}],
                           "admissionChecks": [{"name": "prov", "state": "Pending",
                                                "message": "waiting for the cluster autoscaler"},
                                               {"name": "other", "state": "Ready"}]}}
    state = kueue.admission(pod(), workload)
    assert state.waiting == admission.PROVISIONING
    assert "prov: waiting for the cluster autoscaler" in state.message and "other" not in state.message


def test_an_admitted_pod_reports_its_queue_wait():
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:42Z"}
    state = kueue.admission(pod(gated=False, conditions=(scheduled,)), None)
    assert not state.waiting and state.queue_wait_s == 42.0


@pytest.mark.parametrize("message,reason", [
    ("Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue", admission.PREEMPTED),
    ("The workload is deactivated", admission.EVICTED)])
def test_a_pod_kueue_stops_is_evicted(message, reason):
    stopped = {"type": kueue.TERMINATION_TARGET, "status": "True", "reason": "WorkloadEvicted", "message": message}
    state = kueue.admission(pod(gated=False, conditions=(stopped,)), None)
    assert state.evicted == reason and state.message == message


def test_the_latest_stopped_event_of_the_pod_says_why():
    events = [{"reason": "Stopped", "involvedObject": {"name": "t-0-a0"}, "lastTimestamp": "2026-01-01T00:00:01Z",
               "message": "first"},
              {"reason": "Stopped", "involvedObject": {"name": "t-0-a0"}, "lastTimestamp": "2026-01-01T00:00:09Z",
               "message": "Preempted to accommodate a workload"},
              {"reason": "Stopped", "involvedObject": {"name": "other"}, "lastTimestamp": "2026-01-01T00:00:10Z",
               "message": "not this pod"},
              {"reason": "Started", "involvedObject": {"name": "t-0-a0"}, "lastTimestamp": "2026-01-01T00:00:11Z"}]
    assert kueue.stop_message(events, "t-0-a0") == "Preempted to accommodate a workload"
    assert kueue.stop_message(events[3:], "t-0-a0") is None


def test_a_trial_queued_again_after_a_preemption_says_preempted():
    assert kueue.shown_waiting(admission.QUEUED, "waiting", 2, True)[0] == admission.PREEMPTED
    assert kueue.shown_waiting(admission.QUEUED, "waiting", 2, False) == (admission.QUEUED, "waiting")
    assert kueue.shown_waiting(admission.PROVISIONING, "checks", 1, True)[0] == admission.PROVISIONING


# ---------------------------------------------------------------- spec

def kueue_spec(**budget):
    return make_spec(executor="pod", queue="tuning", priorityClass="tuning-low",
                     trial={"entrypoint": None, "template": POD_TEMPLATE},
                     budget={"maxTrials": 10, "parallelism": 6, **budget})


def test_queue_and_priority_class_are_parsed_for_pod_trials_only():
    spec = kueue_spec()
    assert (spec.queue, spec.priority_class, spec.budget.admission_window) == ("tuning", "tuning-low", 4)
    with pytest.raises(SpecError, match="spec.queue"):
        make_spec(queue="tuning")                      # a Ray Experiment
    with pytest.raises(SpecError, match="spec.priorityClass"):
        make_spec(executor="pod", priorityClass="Not A Name", trial={"entrypoint": None, "template": POD_TEMPLATE})


# ---------------------------------------------------------------- the runner

def test_at_most_the_window_waits_for_admission_and_an_admission_frees_a_place():
    runner = make_runner(kueue_spec(admissionWindow=2))
    launched = of_type(runner.step(0.0), LaunchTrial)
    assert [d.name for d in launched] == ["exp-0", "exp-1"]          # not parallelism (6): the window
    assert runner.awaiting_admission() == ["exp-0", "exp-1"]
    assert not of_type(runner.step(1.0), LaunchTrial)
    assert not runner.on_admission("exp-0", True, 2.0)                # still waiting: nothing changes
    more = of_type(runner.on_admission("exp-0", False, 5.0, queue_wait_s=5.0), LaunchTrial)
    assert [d.name for d in more] == ["exp-2"]
    assert runner.on_admission("exp-0", False, 6.0, queue_wait_s=6.0) == []   # counted once
    summary = runner.summary(6.0).admissions
    assert summary["admissions"] == 1 and summary["waitingForAdmission"] == 2
    assert summary["queueWaitSeconds"] == {"total": 5.0, "mean": 5.0, "max": 5.0}


def test_the_window_never_takes_the_experiment_past_parallelism():
    runner = make_runner(kueue_spec(admissionWindow=10, parallelism=3))
    assert len(of_type(runner.step(0.0), LaunchTrial)) == 3
    for name in ("exp-0", "exp-1", "exp-2"):
        assert not of_type(runner.on_admission(name, False, 1.0, 1.0), LaunchTrial)


def test_a_preempted_trial_pauses_and_resumes_from_its_checkpoint_without_a_failure():
    spec = dataclasses.replace(kueue_spec(maxTrials=1, parallelism=1), trial=dataclasses.replace(
        kueue_spec().trial, max_failures=0))
    runner = make_runner(spec)
    runner.step(0.0)
    runner.on_admission("exp-0", False, 1.0, 1.0)
    runner.on_trial_result("exp-0", Result(0, 1, {"loss": 0.9}, 2.0, checkpoint="ckpt/1", attempt=0), 2.0)
    runner.on_trial_errored("exp-0", "Preempted by Kueue: to accommodate a workload", 3.0, evicted=admission.PREEMPTED)
    trial = runner.trials["exp-0"]
    assert trial.phase is TrialPhase.PENDING and trial.reason == admission.PREEMPTED
    assert trial.failures == 0 and trial.evictions == 1 and "resumes from checkpoint at iteration 1" in trial.message
    [again] = of_type(runner.step(4.0), LaunchTrial)
    assert (again.attempt, again.checkpoint, again.start_iteration, again.last_result_seq) == (1, "ckpt/1", 1, 0)
    assert runner.awaiting_admission() == ["exp-0"]
    assert runner.summary(4.0).admissions["evictions"] == 1
    assert not runner.finished


def test_the_wait_for_admission_does_not_count_against_the_trial_timeout():
    spec = dataclasses.replace(kueue_spec(maxTrials=1, parallelism=1), trial=dataclasses.replace(
        kueue_spec().trial, timeout_s=10.0))
    runner = make_runner(spec)
    runner.step(0.0)
    runner.step(50.0)                                   # 50 s in the queue
    assert runner.trials["exp-0"].phase is TrialPhase.RUNNING
    runner.on_admission("exp-0", False, 50.0, 50.0)
    runner.step(55.0)
    assert runner.trials["exp-0"].phase is TrialPhase.RUNNING
    runner.step(61.0)
    assert runner.trials["exp-0"].reason == "TimedOut"


# ---------------------------------------------------------------- the devcluster's Kueue

def _hook(name: str, path: str) -> dict:
    return {"name": name, "clientConfig": {"service": {"name": "webhook-service", "namespace": "system", "path": path}},
            "failurePolicy": "Fail", "rules": []}


def test_only_the_webhooks_the_manager_serves_are_registered_and_they_call_the_host():
    from kubetune.devcluster.kueue import webhook_configurations
    manifests = [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                  "metadata": {"name": "mutating-webhook-configuration"},
                  "webhooks": [_hook("mpod.kb.io", "/mutate--v1-pod"), _hook("mjob.kb.io", "/mutate-batch-v1-job"),
                               _hook("mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload")]}]
    [config] = webhook_configurations(manifests, "https://127.0.0.1:9443", "Q0E=")
    assert config["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    # a Job webhook the manager does not serve would refuse every Job (failurePolicy: Fail)
    assert [hook["name"] for hook in config["webhooks"]] == ["mpod.kb.io", "mworkload.kb.io"]
    pod = config["webhooks"][0]
    assert pod["clientConfig"] == {"url": "https://127.0.0.1:9443/mutate--v1-pod", "caBundle": "Q0E="}
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]


def test_after_a_restart_the_window_holds_until_the_pods_say_and_no_wait_is_counted_twice():
    from kubetune.core.types import TrialRecord
    spec = kueue_spec(admissionWindow=2, maxTrials=5)
    records = [TrialRecord(name=f"exp-{i}", index=i, params={"x": 0.5}, phase=TrialPhase.RUNNING,
                           queue_wait_s=3.0, queue_waits=1) for i in range(2)]
    runner = make_runner(spec)
    runner.restore(records)
    assert not of_type(runner.step(10.0), LaunchTrial)          # both may still wait: the window is full
    runner.on_admission("exp-0", True, 11.0)                       # still gated: its wait is ahead
    launched = of_type(runner.on_admission("exp-1", False, 11.0, queue_wait_s=3.0), LaunchTrial)
    assert [d.name for d in launched] == ["exp-2"]
    assert runner.trials["exp-1"].queue_wait_s == 3.0              # admitted before the restart: not again
    runner.on_admission("exp-0", False, 20.0, queue_wait_s=12.0)
    assert runner.trials["exp-0"].queue_wait_s == 15.0 and runner.trials["exp-0"].queue_waits == 2


@pytest.mark.parametrize("admitted", [4, 2, 1])
def test_after_a_restart_only_admissions_beyond_parallelism_are_given_back(admitted):
    # with the queue full the runner had parallelism + admissionWindow (2 + 2) pods out;
    # Kueue admitted `admitted` of them while the operator was down
    from kubetune.core.types import TrialRecord
    runner = make_runner(kueue_spec(parallelism=2, admissionWindow=2, maxTrials=6))
    runner.restore([TrialRecord(name=f"exp-{i}", index=i, params={"x": 0.5}, phase=TrialPhase.RUNNING)
                    for i in range(4)])
    given_back = []
    for i in range(4):
        decisions = runner.on_admission(f"exp-{i}", i >= admitted, 10.0)
        given_back += [d.name for d in of_type(decisions, PauseTrial)]
        assert not of_type(decisions, LaunchTrial)
    assert given_back == [f"exp-{i}" for i in range(2, admitted)]
    assert all(runner.trials[name].reason == admission.BEYOND_PARALLELISM for name in given_back)
    running = [name for name, trial in runner.trials.items() if trial.phase is TrialPhase.RUNNING]
    assert len(set(running) - set(runner.awaiting_admission())) == min(admitted, 2)   # never above parallelism


# ---------------------------------------------------------------- parallelism and the window

def test_a_trial_waiting_for_admission_holds_no_parallelism_slot_once_kueue_says_the_queue_is_full():
    runner = make_runner(kueue_spec(parallelism=1, admissionWindow=3))
    assert [d.name for d in of_type(runner.step(0.0), LaunchTrial)] == ["exp-0"]
    # Kueue has not said anything yet: one pod, as parallelism 1 would have without Kueue
    assert not runner.on_admission("exp-0", True, 1.0) and not of_type(runner.step(1.0), LaunchTrial)
    runner.on_admission("exp-0", True, 2.0, queue_full=True)           # no quota for it
    assert [d.name for d in of_type(runner.step(2.0), LaunchTrial)] == ["exp-1", "exp-2"]
    assert runner.awaiting_admission() == ["exp-0", "exp-1", "exp-2"]   # the window, not parallelism
    assert runner.summary(2.0).counts["Failed"] == 0
    runner.on_admission("exp-0", False, 9.0, queue_wait_s=9.0)
    assert not of_type(runner.step(9.0), LaunchTrial)                  # one admitted: parallelism is full


def test_an_admission_beyond_parallelism_is_given_back_as_a_pause_and_relaunched_later():
    runner = make_runner(kueue_spec(parallelism=1, admissionWindow=2, maxTrials=3))
    runner.step(0.0)
    runner.on_admission("exp-0", True, 1.0, queue_full=True)
    runner.step(1.0)
    runner.on_admission("exp-0", False, 5.0, queue_wait_s=5.0)
    [back] = of_type(runner.on_admission("exp-1", False, 5.0, queue_wait_s=4.0), PauseTrial)   # quota freed for two
    trial = runner.trials["exp-1"]
    assert back.name == "exp-1" and trial.phase is TrialPhase.PAUSED
    assert trial.reason == admission.BEYOND_PARALLELISM and trial.failures == 0 and trial.evictions == 0
    assert trial.queue_waits == 0                       # given back: not an admission
    assert not of_type(runner.step(6.0), LaunchTrial)
    runner.on_trial_result("exp-0", Result(0, 1, {"loss": 0.5}, 7.0, attempt=0), 7.0)
    runner.on_trial_completed("exp-0", 7.0)
    assert "exp-1" in [d.name for d in of_type(runner.step(8.0), LaunchTrial)]


@pytest.mark.parametrize("parallelism,window", [(2, 4), (1, 3), (4, 2)])
def test_a_200_trial_experiment_in_a_contended_queue_keeps_both_bounds_and_finishes(parallelism, window):
    """Kueue's quota (3) is shared with another team that holds all of it at times."""
    from kubetune.core.simulate import Simulator
    from unit_helpers import quadratic
    runner = make_runner(kueue_spec(maxTrials=200, parallelism=parallelism, admissionWindow=window))
    sim = Simulator(runner, quadratic, trial_length=3, admission_quota=3,
                    foreign_usage=lambda now: 3 if int(now) % 40 < 25 else (1 if int(now) % 40 < 32 else 0))
    most_waiting = 0
    for _ in range(5000):
        if runner.finished:
            break
        sim.tick()
        assert len(sim.running) <= parallelism           # admitted and running: parallelism
        assert len(sim.waiting) <= window                # waiting for admission: the window
        most_waiting = max(most_waiting, len(sim.waiting))
    assert runner.finished is not None and runner.finished.reason == "MaxTrialsReached"
    summary = runner.summary(sim.now)
    assert summary.counts["Succeeded"] == 200 and summary.counts["Failed"] == 0
    assert most_waiting == window                        # the window was used, beyond parallelism
    assert summary.admissions["admissions"] >= 200


def test_preemptions_are_pauses_for_asha_and_the_failure_budgets():
    """A trial preempted before a rung resumes from its checkpoint and is judged at the rung
    with the values it reaches there; maxFailures 0 and maxFailedTrials 0 are never hit."""
    from kubetune.core.simulate import Simulator
    from unit_helpers import quadratic
    spec = make_spec(executor="pod", queue="tuning", trial={"entrypoint": None, "template": POD_TEMPLATE, "maxFailures": 0},
                     scheduler={"type": "asha", "gracePeriod": 2, "reductionFactor": 2, "maxIterations": 8},
                     budget={"maxTrials": 40, "parallelism": 2, "admissionWindow": 2, "maxFailedTrials": 0})
    runner = make_runner(spec)
    preempted = {f"exp-{i}" for i in range(0, 40, 3)}
    sim = Simulator(runner, quadratic, admission_quota=2, foreign_usage=lambda now: 1 if int(now) % 10 < 5 else 0,
                    faults=lambda name, attempt, iteration: "preempted" if name in preempted and attempt == 0
                    and iteration == 2 else None)
    assert sim.run(5000) is not None and runner.finished.reason == "MaxTrialsReached"
    for name in preempted:
        trial = runner.trials[name]
        assert trial.evictions == 1 and trial.failures == 0 and trial.phase is not TrialPhase.FAILED
        assert trial.iteration >= 2             # resumed past the preemption: judged at the rung it reached
    assert runner.summary(sim.now).admissions["evictions"] == len(preempted)
