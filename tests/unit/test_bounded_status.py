"""Issue 14: a Trial's status is bounded whatever the number of results, valid JSON
whatever a trial reports, and a restarted operator rebuilt from it alone decides
exactly what the one that was never restarted decides."""
from __future__ import annotations

import json
import math

import pytest

from unit_helpers import cpu_ledger, make_runner, make_spec, records_of
from kubetune.controller import render
from kubetune.core.curve import CURVE_POINTS
from kubetune.core.simulate import Simulator
from kubetune.core.types import Result, TrialPhase


def diverging(params, iteration) -> float:
    """A learning curve; trials with x > 0.8 diverge (NaN, then +-Infinity)."""
    if params["x"] > 0.8 and iteration > 3:
        return [math.nan, math.inf, -math.inf][iteration % 3]
    return (params["x"] - 0.3) ** 2 + 1.0 / iteration


def outcome(runner):
    return [(t.name, sorted(t.params.items()), t.phase, t.reason, t.message, t.iteration, t.best_value,
             [dict(p) for p in t.history], t.lineage) for t in runner.trials.values()]


@pytest.mark.parametrize("scheduler", ["fifo", "asha", "hyperband", "median", "pbt"])
@pytest.mark.parametrize("algorithm", ["tpe", "random"])
def test_a_restart_from_the_bounded_status_decides_exactly_as_no_restart(scheduler, algorithm):
    # 150 iterations: curves past their 64 points, median milestones past the dense ones
    spec = make_spec(searchSpace={"x": {"uniform": [0, 1]}, "y": {"loguniform": [1e-3, 1]}},
                     search={"algorithm": algorithm, "seed": 11},
                     scheduler={"type": scheduler, "maxIterations": 150, "gracePeriod": 2,
                                "perturbationInterval": 10},
                     budget={"maxTrials": 16, "parallelism": 4}, trial={"resources": {"cpu": 1}})
    steady = Simulator(make_runner(spec, cpu_ledger(4)), diverging)
    steady.run()

    first = make_runner(spec, cpu_ledger(4))
    restarted = Simulator(first, diverging)
    for restart_at in (90, 260):          # two operator restarts, mid-trial
        while restarted.now < restart_at and not restarted.runner.finished:
            restarted.tick()
        records = records_of(restarted.runner)
        restarted.runner = make_runner(spec, cpu_ledger(4))
        restarted.runner.restore(records)
    restarted.run()

    assert steady.runner.finished == restarted.runner.finished
    assert outcome(restarted.runner) == outcome(steady.runner)


def test_a_trial_status_stays_bounded_and_flat_whatever_the_number_of_results():
    spec = make_spec(scheduler={"type": "median", "gracePeriod": 1}, budget={"maxTrials": 1, "parallelism": 1})
    runner = make_runner(spec)
    name = [d for d in runner.step(0.0) if type(d).__name__ == "LaunchTrial"][0].name
    runner.on_trial_launched(name, 0.0)
    sizes = {}
    for seq in range(30_000):
        metrics = {"loss": 1.0 / (seq + 1), "acc": seq / 30_000, "lr": 0.1, "grad_norm": math.nan,
                   "note": "x" * 300}
        runner.on_trial_result(name, Result(seq, seq + 1, metrics, 0.0), 0.0)
        if seq + 1 in (1_000, 10_000, 30_000):
            status = render.trial_status(runner.trials[name], objective="loss",
                                         decision_state=runner.decision_state(name))
            sizes[seq + 1] = len(json.dumps(status, allow_nan=False))
    assert max(sizes.values()) < 48 * 1024, sizes
    assert sizes[30_000] - sizes[1_000] < 2048, sizes        # flat, not growing with results
    trial = runner.trials[name]
    assert len(trial.history) <= CURVE_POINTS
    assert trial.history[0]["iteration"] == 1 and trial.history[-1]["iteration"] > 29_000


def test_non_finite_objectives_are_the_worst_and_written_as_strings():
    spec = make_spec(objective={"metric": "loss", "mode": "min", "goal": 0.0},
                     budget={"maxTrials": 2, "parallelism": 2})
    runner = make_runner(spec)
    launched = [d.name for d in runner.step(0.0) if type(d).__name__ == "LaunchTrial"]
    for name in launched:
        runner.on_trial_launched(name, 0.0)
    a, b = launched
    runner.on_trial_result(a, Result(0, 1, {"loss": -math.inf, "other": math.inf}, 0.0), 0.0)  # not the goal
    runner.on_trial_result(b, Result(0, 1, {"loss": 2.0}, 0.0), 0.0)
    runner.on_trial_result(a, Result(1, 2, {"loss": math.nan}, 0.0), 0.0)
    assert runner.finished is None
    assert runner.summary(0.0).best_trial == b and runner.summary(0.0).best_metric == 2.0
    assert runner.trials[a].best_value is None and math.isnan(runner.trials[a].last_value)

    status = json.loads(json.dumps(render.trial_status(runner.trials[a], objective="loss"), allow_nan=False))
    assert status["lastObjective"] == "NaN" and "bestMetric" not in status
    assert status["history"][0] == {"iteration": 1, "loss": "-Infinity", "other": "Infinity"}
    restored = render.trial_record({"metadata": {"name": a}, "spec": {"index": 0}, "status": status})
    assert math.isnan(restored.last_value) and restored.history[0]["loss"] == -math.inf


def test_an_asha_trial_that_diverges_is_stopped_at_its_rung_and_never_best():
    spec = make_spec(scheduler={"type": "asha", "maxIterations": 9, "gracePeriod": 1, "reductionFactor": 3},
                     budget={"maxTrials": 6, "parallelism": 6}, search={"seed": 3})
    runner = make_runner(spec)
    sim = Simulator(runner, lambda p, i: math.nan if p["x"] > 0.5 else p["x"] + 1.0 / i)
    sim.run()
    diverged = [t for t in runner.trials.values() if t.params["x"] > 0.5]
    assert diverged
    assert all(t.phase is TrialPhase.STOPPED and t.iteration == 1 for t in diverged)
    assert runner.trials[runner.summary(0).best_trial].params["x"] <= 0.5
    assert math.isfinite(runner.summary(0).best_metric)


def test_a_full_experiment_status_keeps_its_outcome_conditions():
    """The Experiment status is shrunk to its cap, but never by dropping conditions: a
    restarted operator and ``kubectl wait --for=condition=Succeeded`` read the outcome
    there. Long parameter values of the best trial are cut as on the Pareto front."""
    from kubetune.core.types import ExperimentSummary, FinishExperiment
    summary = ExperimentSummary(
        counts={p.value: 0 for p in TrialPhase}, created=3, max_trials=3, best_trial="exp-1",
        best_params={f"p{i:02d}": "v" * 400 for i in range(30)}, best_metric=0.5,
        finished=FinishExperiment("Succeeded", "MaxTrialsReached", "all 3 trials done; " + "m" * 5000))
    extra = [(f"Extra{i}", True, "Why", "x" * 5000) for i in range(6)]
    status = render.experiment_status(summary, total=3, previous={}, generation=2, now=0.0, suspended=False,
                                      extra_conditions=extra)
    types = {c["type"]: c["status"] for c in status["conditions"]}
    assert types["Succeeded"] == "True" and types["Running"] == "False" and types["Failed"] == "False"
    assert all(f"Extra{i}" in types for i in range(6))
    assert all(len(v) <= 67 for v in status["bestTrial"]["parameters"].values())
    assert len(json.dumps(status, allow_nan=False).encode()) <= 16 * 1024


def test_required_status_fields_survive_any_size_pressure_and_stay_valid():
    """AUDIT N15: when keys dominate (64 parameter names of 128 characters, several 1 KiB
    conditions), fit() used to cut date-times (a write the API server refuses) or return {},
    patching phase, startTime and the counts to null: a restart then resumed a finished run."""
    import re

    from kubetune.core.types import ExperimentSummary, FinishExperiment
    summary = ExperimentSummary(
        counts={p.value: 0 for p in TrialPhase}, created=3, max_trials=3, best_trial="exp-1",
        best_params={f"{i:02d}" + "k" * 126: i for i in range(64)}, best_metric=0.5,
        finished=FinishExperiment("Succeeded", "GoalReached", "goal reached"))
    extra = [(f"Extra{i}", True, "Why", "x" * 1000) for i in range(9)]
    status = render.experiment_status(summary, total=3, previous={}, generation=2, now=1_700_000_000.0,
                                      suspended=False, extra_conditions=extra)
    assert status["phase"] == "Succeeded" and status["trialCounts"]["created"] == 3
    assert status["observedGeneration"] == 2 and status["progress"] == "0/3"
    date_time = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
    assert date_time.match(status["startTime"]) and date_time.match(status["completionTime"])
    assert len(json.dumps(status, allow_nan=False).encode()) <= 16 * 1024
    # the parameters map lost entries whole (its keys are what is big), nothing was cut mid-key
    kept = status.get("bestTrial", {}).get("parameters", {})
    assert all(len(key) == 128 for key in kept)


def test_fit_shrinks_maps_by_their_keys_and_never_cuts_short_strings():
    from kubetune.core.sanitize import fit, json_size
    many = {f"{i:04d}" + "k" * 124: i for i in range(500)}
    value = {"phase": "Running", "when": "2026-01-01T00:00:00Z", "nested": {"params": many, "name": "trial-7"}}
    bounded = fit(value, 4096)
    assert json_size(bounded) <= 4096
    assert bounded["phase"] == "Running" and bounded["when"] == "2026-01-01T00:00:00Z"
    assert bounded["nested"]["name"] == "trial-7" and 0 < len(bounded["nested"]["params"]) < 500
    # kept keys hold even when nothing else fits
    squeezed = fit({"phase": "Failed", "startTime": "2026-01-01T00:00:00Z", **many}, 200,
                   keep=("phase", "startTime"))
    assert squeezed["phase"] == "Failed" and squeezed["startTime"] == "2026-01-01T00:00:00Z"


def test_an_unreachable_ray_cluster_is_the_first_thing_the_message_says_with_since_when():
    """status.message is what kubectl get -o wide, Argo CD and describe show first: a Ray
    cluster that cannot be reached is named there with its cause and since when, not
    only in the RayUnavailable condition; it goes once the cluster answers."""
    from kubetune.core.types import ExperimentSummary
    summary = ExperimentSummary(counts={p.value: 0 for p in TrialPhase}, created=0, max_trials=2)
    cause = ("cannot reach Ray at ray://ray-head.invalid:10001: cannot open a connection to ray-head.invalid:10001: "
             "the host name ray-head.invalid does not resolve (Name or service not known)")
    down = [("RayUnavailable", True, "ConnectionFailed", cause)]
    first = render.experiment_status(summary, total=2, previous={}, generation=1, now=1_800_000_000.0,
                                     suspended=False, extra_conditions=down)
    assert first["phase"] == "Running"
    message = first["message"]
    assert message.startswith(cause), message
    assert "(since 2027-01-15T08:00:00Z; retrying)" in message, message
    assert "check spec.ray.address" in message and message.endswith("0 running, 0 queued, 0/2 done"), message
    # later writes keep the same "since" (the condition's transition time): no churn
    later = render.experiment_status(summary, total=2, previous=first, generation=1, now=1_800_000_600.0,
                                     suspended=False, extra_conditions=down)
    assert later["message"] == message
    back = render.experiment_status(summary, total=2, previous=later, generation=1, now=1_800_000_900.0,
                                    suspended=False, extra_conditions=[("RayUnavailable", False, "Connected", "")])
    assert back["message"] == "0 running, 0 queued, 0/2 done"


def test_queued_trials_say_what_they_wait_for_in_the_message():
    from kubetune.core.types import ExperimentSummary
    summary = ExperimentSummary(counts={**{p.value: 0 for p in TrialPhase}, "Queued": 2}, created=2, max_trials=8,
                                queue_reason="2: waiting for 1 GPU (0 free of 0); scale-up requested")
    status = render.experiment_status(summary, total=8, previous={}, generation=1, now=0.0, suspended=False)
    assert status["message"] == ("0 running, 2 queued, 0/8 done; queued: 2: waiting for 1 GPU (0 free of 0); "
                                 "scale-up requested"), status["message"]
