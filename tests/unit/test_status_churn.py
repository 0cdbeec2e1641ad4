"""Status writes follow what a status means, not every move of a figure (issue 26: 9.3
Trial status PATCHes per trial and ~30 Experiment PATCHes per Experiment with 200
Experiments): a queued Trial is not rewritten while the line moves past it, and the
Experiment is not rewritten for a change of its usage alone before
EXPERIMENT_USAGE_WRITE_INTERVAL (controller/status_writer.py, core/feasibility.py).
On the real API server: the write counts of python -m kubetune.bench.scale."""
from __future__ import annotations

import asyncio

from kubetune.controller.coalesce import differs_beyond
from kubetune.controller.status_writer import EXPERIMENT_USAGE_WRITE_INTERVAL
from kubetune.controller.store import MemoryStore
from kubetune.core.resources import Resources
from kubetune.core.types import CreateTrial, LaunchTrial, Result, TrialPhase, TrialPhaseChanged
from unit_helpers import controller_with_runner, cpu_ledger, make_runner, make_spec

CPU = [Resources(cpu=1)]


def test_only_volatile_fields_differing_is_no_change_that_matters():
    written = {"phase": "Running", "trialCounts": {"running": 2}, "usage": {"cpuSeconds": 1.0}}
    assert not differs_beyond(written, {**written, "usage": {"cpuSeconds": 9.0}}, ("usage",))
    assert differs_beyond(written, {**written, "usage": {"cpuSeconds": 9.0}}, ())
    assert differs_beyond(written, {**written, "trialCounts": {"running": 1}}, ("usage",))
    assert differs_beyond(written, {"phase": "Running", "trialCounts": {"running": 2}, "bestTrial": {}}, ("usage",))
    without = {k: v for k, v in written.items() if k != "trialCounts"}
    assert differs_beyond(written, without, ("usage",))          # a field gone is a change too


def test_a_queued_trial_is_not_rewritten_while_the_line_moves_past_it():
    """Requests of higher priority take each room that frees: the runner's trials try
    again after every release (room free, not their turn) and every grant (nothing
    free); what they wait for never changed, so no decision to write them again."""
    ledger = cpu_ledger(2)
    holders = [f"ns/other/h{i}" for i in range(2)]
    for owner in holders:
        assert ledger.try_acquire(owner, CPU)
    ahead = [f"ns/urgent/w{i}" for i in range(4)]
    for owner in ahead:
        ledger.set_waiting(owner, CPU, priority=5)
    runner = make_runner(make_spec(budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 1}}),
                         ledger, owner="ns/exp/")
    first = [d for d in runner.step(0.0) if isinstance(d, TrialPhaseChanged)]
    assert [d.phase for d in first] == [TrialPhase.QUEUED] * 2
    said = {d.message for d in first}
    later, now = [], 1.0
    while ahead:
        ledger.release(holders.pop(0))          # room for one, an urgent request's
        later += runner.step(now)
        owner = ahead.pop(0)
        assert ledger.try_acquire(owner, CPU, priority=5)
        holders.append(owner)
        later += runner.step(now + 0.5)         # full again
        now += 1.0
    assert [d for d in later if isinstance(d, TrialPhaseChanged)] == [] and len(said) == 1, said
    assert all(runner.trials[name].phase is TrialPhase.QUEUED for name in runner.active_trials())
    ledger.release(holders.pop(0))              # nobody ahead any more: it starts, and that is written
    assert any(isinstance(d, LaunchTrial) for d in runner.step(now))


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.experiment_writes: list[dict] = []

    async def patch_experiment_status(self, status) -> None:
        self.experiment_writes.append(dict(status))
        await super().patch_experiment_status(status)


def test_the_experiment_is_not_rewritten_for_its_usage_alone_before_the_interval():
    store, clock = CountingStore(), [1.0]
    controller, runner, decisions = controller_with_runner(store, clock, maxTrials=1, parallelism=1)
    (name,) = [d.name for d in decisions if isinstance(d, LaunchTrial)]

    def host_saw(seen: float) -> None:       # what the trial's host says of its run
        assert runner.on_trial_usage(name, runner.trials[name].attempt, 1.0, seen)

    async def flush_at(now: float) -> int:
        clock[0] = now
        before = len(store.experiment_writes)
        await controller.flush()
        return len(store.experiment_writes) - before

    async def scenario() -> None:
        await controller.effects.apply([d for d in decisions if isinstance(d, CreateTrial)])
        runner.on_trial_launched(name, 1.0)
        runner.on_trial_result(name, Result(seq=1, iteration=1, metrics={"loss": 0.5}, timestamp=1.0), 1.0)
        host_saw(2.0)
        assert await flush_at(2.0) == 1
        written = store.experiment_writes[-1]["usage"]["runSeconds"]
        for now in (4.0, 6.0, 10.0, 20.0):        # the run goes on: only its usage moves
            host_saw(now)
            assert await flush_at(now) == 0
        host_saw(2.0 + EXPERIMENT_USAGE_WRITE_INTERVAL)
        assert await flush_at(2.0 + EXPERIMENT_USAGE_WRITE_INTERVAL) == 1     # then it goes out
        assert store.experiment_writes[-1]["usage"]["runSeconds"] > written
        # a change that matters goes out at once, with the usage as it is then
        host_saw(40.0)
        runner.on_trial_result(name, Result(seq=2, iteration=2, metrics={"loss": 0.1}, timestamp=40.0), 40.0)
        assert await flush_at(40.0) == 1
        assert store.experiment_writes[-1]["bestTrial"]["metric"] == 0.1
        assert store.experiment_writes[-1]["usage"]["runSeconds"] == 39.0
    asyncio.run(scenario())
