"""The GPU-hour ledger and budgets in the pure core (issue 27): what a trial used is its
hosts' run time over every attempt, once, across a restart; a gpuHours budget ends an
ASHA run within one report of the limit, Succeeded with BudgetExhausted, and a raised
budget reopens it."""
from __future__ import annotations

import pytest

from kubetune.core.budget import BUDGET_EXHAUSTED
from kubetune.core.simulate import Simulator
from kubetune.core.types import StopTrial, TrialPhase
from kubetune.core.usage import TrialUsage
from unit_helpers import make_runner, make_spec, of_type, quadratic, records_of

TICK = 30.0     # simulated seconds per iteration


def run(sim: Simulator, ticks: int | None = None) -> None:
    for _ in range(ticks if ticks is not None else 2_000):
        if sim.runner.finished:
            return
        sim.tick(TICK)


def test_the_ledger_counts_every_attempt_once_across_a_restart():
    spec = make_spec(scheduler={"maxIterations": 10}, budget={"maxTrials": 2, "parallelism": 2},
                     trial={"maxFailures": 1, "resources": {"cpu": 4, "gpu": 2}})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic, checkpoint_every=2,
                    faults=lambda name, attempt, iteration: "error" if (name, attempt, iteration) == ("exp-0", 0, 5) else None)
    run(sim, 7)
    restored = make_runner(spec)
    restored.restore(records_of(runner))
    sim.runner = restored
    sim.reattach()
    run(sim)
    usage = {name: trial.usage.totals() for name, trial in restored.trials.items()}
    # exp-0: 4 iterations, a tick that ends in an error, a retry from its checkpoint at 4 that
    # runs 5..10; exp-1: 10
    assert restored.trials["exp-0"].attempt == 1
    for name, seconds in sim.run_seconds.items():
        assert usage[name]["runSeconds"] == pytest.approx(seconds)
        assert usage[name]["gpuSeconds"] == pytest.approx(2 * seconds)
        assert usage[name]["cpuSeconds"] == pytest.approx(4 * seconds)
    assert usage["exp-0"]["runSeconds"] == (4 + 1 + 6) * TICK and usage["exp-1"]["runSeconds"] == 10 * TICK
    total = restored.summary(sim.now).usage
    assert total["gpuSeconds"] == 2 * 21 * TICK and total["gpuHours"] == round(2 * 21 * TICK / 3600, 4)


def test_a_host_answer_after_its_attempt_closed_is_not_counted_again():
    usage = TrialUsage()
    assert usage.observe(0, 100.0, 130.0, gpus=1, cpus=1)
    assert usage.observe(1, 200.0, 260.0, gpus=1, cpus=1)     # attempt 0 closed at 130
    assert not usage.observe(0, 100.0, 190.0, gpus=1, cpus=1, ended=True)
    usage.saw(1, 270.0)
    assert usage.totals()["runSeconds"] == 30.0 + 70.0
    again = TrialUsage.from_status(usage.to_status())
    assert again.observe(1, 200.0, 290.0, gpus=1, cpus=1, ended=True)   # same start: counted once
    assert again.totals() == {"gpuSeconds": 120.0, "cpuSeconds": 120.0, "runSeconds": 120.0, "queueSeconds": 0.0}


def asha(budget: dict, maxTrials: int = 40, **extra):
    return make_spec(scheduler={"type": "asha", "maxIterations": 27}, search={"algorithm": "random", "seed": 3},
                     budget={"maxTrials": maxTrials, "parallelism": 4, **budget},
                     trial={"resources": {"cpu": 1, "gpu": 1}, **extra})


def test_a_gpu_hour_budget_ends_an_asha_run_within_one_report_and_a_raise_reopens_it():
    spec = asha({"gpuHours": 1.0})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    run(sim)
    finished = runner.finished
    assert (finished.phase, finished.reason) == ("Succeeded", BUDGET_EXHAUSTED)
    assert "spec.budget.gpuHours 1 used up" in finished.message and "best" in finished.message
    used = runner.summary(sim.now).usage["gpuHours"]
    # stopped once one more first rung (one iteration) would pass the limit, and then at
    # most one more report of each running trial
    assert 1.0 - TICK / 3600 <= used <= 1.0 + 4 * TICK / 3600
    stopped = [d for d in of_type(sim.log, StopTrial) if d.reason == BUDGET_EXHAUSTED]
    assert stopped and runner.summary(sim.now).best_trial is not None
    created = runner.summary(sim.now).created
    assert created < 40

    sim.apply(runner.on_spec_changed(asha({"gpuHours": 1.5}, maxTrials=80), sim.now))
    assert runner.finished is None
    run(sim)
    assert runner.finished.reason == BUDGET_EXHAUSTED and runner.summary(sim.now).created > created
    assert 1.5 - TICK / 3600 <= runner.summary(sim.now).usage["gpuHours"] <= 1.5 + 4 * TICK / 3600


def test_finish_rung_lets_running_trials_reach_their_rung_and_promotes_none():
    spec = asha({"gpuHours": 1.0, "onExhausted": "finishRung"})
    runner = make_runner(spec)
    sim = Simulator(runner, quadratic)
    run(sim)
    assert runner.finished.reason == BUDGET_EXHAUSTED
    rungs = {1, 3, 9, 27}
    ended = [runner.trials[d.name].iteration for d in of_type(sim.log, StopTrial) if d.reason == BUDGET_EXHAUSTED]
    assert ended and set(ended) <= rungs


def test_the_budget_counts_what_was_used_so_early_stopping_buys_more_trials():
    fifo = make_runner(make_spec(scheduler={"maxIterations": 27}, budget={"maxTrials": 40, "parallelism": 4,
                                                                          "gpuHours": 2.0},
                                 trial={"resources": {"gpu": 1}}))
    early = make_runner(asha({"gpuHours": 2.0}))
    for runner in (fifo, early):
        run(Simulator(runner, quadratic))
    finished = lambda r: sum(1 for t in r.trials.values() if t.phase is not TrialPhase.PENDING)
    assert finished(early) > 2 * finished(fifo)
