"""A finished Experiment keeps nothing in the operator's memory (issue 26): once it is at
rest its controller (runner, every trial's state) goes, its counts stay for the metrics,
and a spec change brings a new controller restored from the Trials.  The operator's own
serve loop (controller/operator_state.py), on real Ray, with the in-memory store of
`kubetune run` in place of the API server (the loop is the same: controller/store.py)."""
from __future__ import annotations

import asyncio
import gc
import time
import uuid
import weakref

import pytest

from kubetune.controller.operator_state import OperatorState
from kubetune.controller.store import MemoryStore
from kubetune.executors.platform import PlatformRegistry
from kubetune.executors.ray.executor import RayExecutor
from kubetune.executors.ray.platform import RayPlatforms

pytestmark = pytest.mark.integration


def _experiment(name: str, max_trials: int) -> dict:
    return {"apiVersion": "kubetune.dev/v1alpha1", "kind": "Experiment",
            "metadata": {"name": name, "namespace": "rest", "generation": 1, "uid": str(uuid.uuid4())},
            "spec": {"objective": {"metric": "val_loss", "mode": "min"},
                     "searchSpace": {"x": {"uniform": [-5.0, 5.0]}, "y": {"uniform": [-5.0, 5.0]}},
                     "search": {"algorithm": "random", "seed": 3},
                     "budget": {"maxTrials": max_trials, "parallelism": 2},
                     "trial": {"entrypoint": "kubetune.examples.quadratic:train", "resources": {"cpu": 0.25},
                               "config": {"iterations": 2, "delay": 0.0}}}}


async def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.1)


def test_a_finished_experiment_lets_its_controller_go_and_a_spec_change_brings_one_back(ray_local):
    body = _experiment(f"e{uuid.uuid4().hex[:6]}", max_trials=3)
    store = MemoryStore()
    body["status"] = store.experiment_status     # the live view kopf gives: what was written
    state = OperatorState(PlatformRegistry({"ray": RayPlatforms(ray_local, RayExecutor)}),
                          store_factory=lambda *_: store, checkpoint_storage="")
    key = ("rest", body["metadata"]["name"])
    stop = []

    def phases() -> list:
        return sorted(t["status"].get("phase") for t in store.trials.values())

    async def scenario() -> None:
        daemon = asyncio.create_task(state.serve(*key, body, lambda: bool(stop)))
        try:
            await _until(lambda: key in state.controllers, 60, "the Experiment's controller")
            controller = weakref.ref(state.controllers[key])
            await _until(lambda: key in state.resting, 180, "the finished Experiment to rest")
            assert key not in state.controllers
            gc.collect()
            assert controller() is None, gc.get_referrers(controller())   # its runner and trials are gone
            assert phases() == ["Succeeded"] * 3
            assert state.resting[key] == {"phase": "Succeeded", "trialCounts": store.experiment_status["trialCounts"]}

            body["spec"]["budget"]["maxTrials"] = 5                # GitOps raises the budget
            body["metadata"]["generation"] = 2
            state.wake(*key)
            await _until(lambda: len(store.trials) == 5 and key in state.resting, 180,
                         "the reopened Experiment to run its 2 new trials and rest again")
            assert phases() == ["Succeeded"] * 5
            assert sorted(store.trials) == [f"{key[1]}-{i}" for i in range(5)]   # nothing repeated
            params = [tuple(t["spec"]["parameters"].items()) for t in store.trials.values()]
            assert len(set(params)) == 5
            assert store.experiment_status["observedGeneration"] == 2
        finally:
            stop.append(True)
            state.wake(*key)
            await asyncio.wait_for(daemon, 30)
        assert key not in state.resting and key not in state.controllers

    asyncio.run(scenario())
    RayExecutor(ray_local).stop_all(f"{key[0]}/{key[1]}/")
