"""A new Experiment's first Trial is created before its platform answers (issue 26:
apply -> first Trial).  The first connection to the operator's own Ray takes seconds
under load, and every Experiment applied meanwhile waited for it; creating a Trial needs
none of it.  Nothing is launched before the platform answers."""
from __future__ import annotations

import asyncio
import threading

from kubetune.controller.operator_state import OperatorState
from kubetune.controller.store import MemoryStore
from kubetune.core.types import CreateTrial
from kubetune.executors.platform import PlatformRegistry
from kubetune.executors.ray.platform import RayPlatforms
from ray_fakes import FakeRayConnection
from unit_helpers import make_runner, make_spec

SPEC = {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"x": {"uniform": [0.0, 1.0]}},
        "trial": {"entrypoint": "m:f"}, "budget": {"maxTrials": 5, "parallelism": 2}}


def test_a_new_runner_decides_its_first_trial_and_launches_nothing():
    # one: in a burst, every Experiment's first Trial goes before anyone's second
    runner = make_runner(make_spec(budget={"maxTrials": 5, "parallelism": 2}))
    first = runner.first_trials()
    assert [type(d) for d in first] == [CreateTrial] and first[0].name == "exp-0"
    assert runner.first_trials() == []              # once: then its steps decide
    assert [d.name for d in runner.step(0.0) if isinstance(d, CreateTrial)] == ["exp-1"]


def test_not_with_warm_start_nor_suspended():
    warm = make_spec(budget={"maxTrials": 5, "parallelism": 2}, warmStart={"experiments": ["earlier"]})
    assert make_runner(warm).first_trials() == []
    assert make_runner(make_spec(budget={"maxTrials": 5, "parallelism": 2}, suspend=True)).first_trials() == []


class SlowToConnect(FakeRayConnection):
    """The operator's own Ray, whose first connection has not answered yet."""

    def __init__(self) -> None:
        self.answer = threading.Event()

    def connect(self) -> None:
        if not self.answer.wait(5):
            raise ConnectionError("no answer from the head")

    def cluster_resources(self):
        from types import SimpleNamespace
        return SimpleNamespace(total={"CPU": 4.0}, nodes=[])

    def request_resources(self, bundles) -> None:
        pass


def test_its_trials_exist_while_the_first_connection_is_still_being_made():
    ray = SlowToConnect()
    store = MemoryStore()
    state = OperatorState(PlatformRegistry({"ray": RayPlatforms("ray://head:10001", lambda address: ray)}),
                          store_factory=lambda *_: store, checkpoint_storage="")
    seen: list[dict] = []

    def stopped() -> bool:      # asked before each cycle (the first waits for the connection)
        if not seen and store.trials:
            seen.append({name: dict(t.get("status") or {}) for name, t in store.trials.items()})
            ray.answer.set()     # only now does the head answer
        return bool(seen)

    body = {"metadata": {"name": "e", "uid": "u1", "generation": 1}, "spec": SPEC}

    async def main():
        watch = asyncio.ensure_future(state.serve("ns", "e", body, stopped))
        deadline = asyncio.get_running_loop().time() + 10
        while not seen and asyncio.get_running_loop().time() < deadline:
            if store.trials:
                stopped()
            await asyncio.sleep(0.01)
        await asyncio.wait_for(watch, 20)
    asyncio.run(main())
    assert seen, "no Trial was created before the head answered"
    assert sorted(seen[0]) == ["e-0"]
    assert all(status.get("phase") in (None, "Pending") for status in seen[0].values())   # none launched


def test_before_the_connection_only_the_first_trial_is_created_and_nothing_queued_is_carried_out():
    # found by review: the step before the connection carried out the whole effect queue, so
    # a stop queued in a Ray outage (a platform call) was tried before ensure_connected, kept
    # failing, and its failures pushed the reconnect back
    from kubetune.controller.effects import _Effect
    from kubetune.core.types import StopTrial, TrialPhase
    from unit_helpers import controller_with_runner
    store, clock = MemoryStore(), [1.0]
    controller, runner, decisions = controller_with_runner(store, clock, maxTrials=2, parallelism=2)
    create = next(d for d in decisions if isinstance(d, CreateTrial))

    async def first_cycle() -> None:       # a new Experiment: an empty queue, its first Trial made
        await controller.effects.create_first([create])
    asyncio.run(first_cycle())
    assert list(store.trials) == [create.name] and not controller.effects

    stop = _Effect(StopTrial("exp-9", TrialPhase.STOPPED, "EarlyStopped"))
    controller.effects._effects.append(stop)       # queued when the platform went away
    later = CreateTrial("exp-1", 1, {"x": 0.5})

    async def during_an_outage() -> None:   # registry=None: any platform call would raise
        await controller.effects.create_first([later])
    asyncio.run(during_an_outage())
    assert stop.attempts == 0, "a queued stop was carried out before the connection"
    assert list(store.trials) == [create.name]      # the create waits behind it, in order
    assert [e.decision for e in controller.effects._effects] == [stop.decision, later]
