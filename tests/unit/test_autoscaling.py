"""Autoscaling-aware queueing, the pure parts (issue 5): node types from autoscaling
configs, the Experiment's queue summary and Queued condition, and the aggregated
autoscaler request of a RayPlatform (driven here by a scripted executor; the
integration tests run the real one against Ray's fake autoscaler)."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import yaml

from kubetune.controller import render
from kubetune.executors.ray.platform import RayPlatform
from kubetune.core.resources import ResourceLedger, Resources
from kubetune.core.types import ExperimentSummary
from kubetune.executors.base import ClusterResources, NodeResources
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.executors.ray.autoscaler import node_type_shapes
from ray_fakes import FakeRayConnection
from waiting import until

REPO = Path(__file__).resolve().parents[2]
GPU = Resources(cpu=2, gpu=1)


# ---------------------------------------------------------------- node types from a config

def test_node_types_are_the_worker_types_that_can_be_launched():
    config = {"max_workers": 3, "head_node_type": "head",
              "available_node_types": {
                  "head": {"resources": {"CPU": 8}, "max_workers": 0},
                  "gpu": {"resources": {"CPU": 4, "GPU": 1}, "max_workers": 2},
                  "retired": {"resources": {"CPU": 64, "GPU": 8}, "max_workers": 0},
                  "cpu": {"resources": {"CPU": 16}}}}
    assert node_type_shapes(config) == [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 16.0}]


@pytest.mark.parametrize("config", [None, {}, {"max_workers": 0, "available_node_types": {
    "gpu": {"resources": {"GPU": 1}, "max_workers": 2}}}])
def test_no_autoscaler_or_one_that_launches_nothing_means_cannot_grow(config):
    assert node_type_shapes(config) is None


def test_kuberay_example_cluster_offers_its_gpu_worker_group():
    # what the head task computes on KubeRay: Ray's own RayCluster -> autoscaling config
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr
    ray_cluster = yaml.safe_load((REPO / "examples/kuberay/raycluster.yaml").read_text())
    ray_cluster["metadata"]["namespace"] = "default"
    shapes = [Resources.from_ray(s) for s in node_type_shapes(_derive_autoscaling_config_from_ray_cr(ray_cluster))]
    assert [(s.cpu, s.gpu) for s in shapes] == [(4, 0), (4, 1)]
    head_only = ResourceLedger()
    head_only.set_capacity(Resources(), [Resources()], shapes)
    assert head_only.feasibility([Resources(cpu=1, gpu=1)]) is None


# ---------------------------------------------------------------- queue summary

def gpu_ledger(nodes: int, node_types: list[Resources] | None = (GPU,)) -> ResourceLedger:
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=2 * nodes, gpu=nodes), [GPU] * nodes or [Resources()],
                        list(node_types) if node_types is not None else None)
    return ledger


def test_summary_says_what_the_queued_trials_wait_for_not_how_many():
    """How many are queued is in the Experiment's counts: the words stay while it moves."""
    ledger = gpu_ledger(0)
    owners = [f"ns/exp/exp-{i}" for i in range(3)]
    for owner in owners:
        ledger.set_waiting(owner, [Resources(cpu=0.5, gpu=1)])
    assert ledger.queue_summary(owners) == "waiting for 1 GPU: the cluster has 0 GPU; scale-up requested"
    assert ledger.queue_summary(owners[:1]) == ledger.queue_summary(owners)
    assert ledger.queue_summary(["ns/exp/unknown"]) == ""


def test_summary_of_a_multi_bundle_trial_on_a_cluster_that_cannot_grow():
    ledger = gpu_ledger(2, node_types=None)
    assert ledger.try_acquire("ns/other/t", [Resources(cpu=1, gpu=1)])
    ledger.set_waiting("ns/exp/pair", [Resources(cpu=0.5, gpu=1)] * 2)
    assert ledger.queue_summary(["ns/exp/pair"]) == f"waiting for 2 GPU of the cluster's 2: in use, or kept for requests ahead in line (fair sharing)"


def test_summary_of_a_fragmented_cluster_says_one_node_is_needed():
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=4), [Resources(cpu=2)] * 2, None)
    ledger.set_waiting("ns/exp/big", [Resources(cpu=3)])
    assert ledger.queue_summary(["ns/exp/big"]) == \
        "waiting for 3 CPU on one node (enough is free in all, split across 2 nodes)"


# ---------------------------------------------------------------- Queued condition

def summary(queued: int, reason: str = "") -> ExperimentSummary:
    return ExperimentSummary(counts={"Queued": queued, "Running": 1}, created=queued + 1, best_trial=None,
                             best_params=None, best_metric=None, best_iteration=None, queue_reason=reason,
                             finished=None, max_trials=10)


def queued_condition(status: dict) -> dict | None:
    return next((c for c in status["conditions"] if c["type"] == "Queued"), None)


def test_queued_condition_follows_the_queue():
    reason = "waiting for 1 GPU: the cluster has 0 GPU; scale-up requested"
    never = render.experiment_status(summary(0), total=10, previous={}, generation=1, now=0.0, suspended=False)
    assert queued_condition(never) is None
    queued = render.experiment_status(summary(2, reason), total=10, previous=never, generation=1, now=1.0,
                                      suspended=False)
    assert {k: queued_condition(queued)[k] for k in ("status", "reason", "message")} == \
        {"status": "True", "reason": "TrialsQueued", "message": reason}
    assert queued["queueReason"] == reason
    drained = render.experiment_status(summary(0), total=10, previous=queued, generation=1, now=2.0,
                                       suspended=False)
    assert {k: queued_condition(drained)[k] for k in ("status", "reason", "message")} == \
        {"status": "False", "reason": "NoneQueued", "message": ""}


# ---------------------------------------------------------------- the autoscaler request

class ScriptedExecutor(FakeRayConnection):
    """Answers like RayExecutor from a script: the cluster's nodes, its node types, and
    a record of every request_resources call."""

    def __init__(self, nodes: list[dict], node_types=(GPU,), fail_node_types: str = "") -> None:
        self.nodes = nodes
        self._node_types = list(node_types)
        self.fail_node_types = fail_node_types
        self.requests: list[list[dict]] = []

    def connect(self) -> None:
        pass

    @staticmethod
    def is_unavailable(error: BaseException) -> bool:
        return isinstance(error, RayUnavailableError)

    def cluster_resources(self) -> ClusterResources:
        total: dict[str, float] = {}
        for node in self.nodes:
            for k, v in node.items():
                total[k] = total.get(k, 0.0) + v
        return ClusterResources(total, dict(total), [NodeResources(f"n{i}", "", n, n) for i, n in enumerate(self.nodes)])

    def node_types(self):
        if self.fail_node_types:
            raise RayUnavailableError("10.0.0.1:6379", self.fail_node_types)
        return self._node_types

    def request_resources(self, bundles) -> None:
        self.requests.append(bundles)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_request_names_held_and_waiting_bundles_and_is_withdrawn_when_nothing_waits():
    async def scenario():
        clock, executor = Clock(), ScriptedExecutor([{"CPU": 2, "GPU": 1}])
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected()
        assert executor.requests == [[]]         # a stale request of an earlier operator is dropped
        ledger, bundle = handle.ledger, [Resources(cpu=0.5, gpu=1)]
        assert ledger.autoscaling and ledger.try_acquire("ns/e/t0", bundle)
        for name in ("t1", "t2"):      # as the runner queues a trial
            ledger.set_waiting(f"ns/e/{name}", bundle)
            assert not ledger.try_acquire(f"ns/e/{name}", bundle)
        clock.now += 5
        await handle.refresh_capacity()
        assert executor.requests[-1] == [{"CPU": 0.5, "GPU": 1.0}] * 3
        clock.now += 5
        await handle.refresh_capacity()
        assert len(executor.requests) == 2       # unchanged: not sent again
        ledger.release("ns/e/t1")
        clock.now += 5
        await handle.refresh_capacity()
        assert executor.requests[-1] == [{"CPU": 0.5, "GPU": 1.0}] * 2
        ledger.release("ns/e/t2")
        await handle.sync_autoscaler_request()  # e.g. the Experiment was deleted
        assert executor.requests[-1] == []
        clock.now += 5
        await handle.refresh_capacity()
        assert len(executor.requests) == 4
    asyncio.run(scenario())


def test_unreadable_node_types_leave_growth_unknown_not_fixed_size():
    # what fits the nodes starts; a trial no node fits waits (it is not failed as
    # infeasible on a cluster that may well grow) until the node types are read
    async def scenario():
        clock = Clock()
        executor = ScriptedExecutor([{"CPU": 2}], fail_node_types="cannot read the autoscaler's node types")
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected() and handle.last_error == ""
        ledger = handle.ledger
        assert ledger.capacity_known and not ledger.growth_known and not ledger.autoscaling
        assert ledger.feasibility([Resources(cpu=1, gpu=1)]) is None
        assert ledger.try_acquire("ns/e/t0", [Resources(cpu=1)])
        ledger.set_waiting("ns/e/t1", [Resources(cpu=1, gpu=1)])
        assert ledger.queue_reason("ns/e/t1").endswith(
            "the cluster has 0 GPU; the autoscaler's node types are unknown: RayUnavailableError: "
            "Ray at '10.0.0.1:6379' is unavailable: cannot read the autoscaler's node types")
        clock.now += 5
        await handle.refresh_capacity()
        assert executor.requests == []           # nothing asked while it is unknown what could grow
        ledger.clear_waiting("ns/e/t1")
        executor.fail_node_types, executor._node_types = "", None   # the head answers: it cannot grow
        clock.now += 5                            # past the retry's backoff and the refresh interval
        await handle.refresh_capacity()
        await until(lambda: handle._growth.known, "the node types read", deadline=5)
        clock.now += 5
        await handle.refresh_capacity()
        assert ledger.growth_known and not ledger.autoscaling
        assert ledger.feasibility([Resources(cpu=1, gpu=1)]) == "needs 1 GPU per bundle; the largest node offers 0 GPU"
    asyncio.run(scenario())


def test_a_slow_head_does_not_hold_up_placement_past_the_first_wait(monkeypatch):
    # the read is a task on the head: on a busy head it took 30 s and more, and nothing
    # was placed meanwhile (a restarted operator beside dozens of starting actors)
    import threading
    from kubetune.executors.ray import growth
    monkeypatch.setattr(growth, "FIRST_WAIT_S", 0.05)
    answered = threading.Event()

    async def scenario():
        executor = ScriptedExecutor([{"CPU": 2}])
        executor.node_types = lambda: answered.wait(30) and [Resources(cpu=4, gpu=1)]
        clock = Clock()
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected()                 # not waiting for the head
        assert handle.ledger.try_acquire("ns/e/t0", [Resources(cpu=1)])
        assert not handle.ledger.growth_known
        # later refreshes (under the lock every Experiment's step takes) do not wait at all
        monkeypatch.setattr(growth, "FIRST_WAIT_S", 60.0)
        for _ in range(3):
            clock.now += 5
            await asyncio.wait_for(handle.refresh_capacity(), 10)
            await asyncio.wait_for(handle.ensure_connected(), 10)
        assert not handle.ledger.growth_known
        answered.set()
        await until(lambda: handle._growth.known, "the node types read", deadline=30)
        clock.now += 5
        await handle.refresh_capacity()
        assert handle.ledger.autoscaling and handle.ledger.node_shapes()[1] == [Resources(cpu=4, gpu=1)]
    asyncio.run(scenario())


def test_an_experiment_that_finishes_with_trials_queued_withdraws_their_request():
    # a finished Experiment's cycles make no Ray call: ending its runs must withdraw the
    # request itself, or the GPU nodes it asked for stay up
    from types import SimpleNamespace
    from kubetune.controller.experiment import ExperimentController

    async def scenario():
        executor = ScriptedExecutor([{"CPU": 2}])
        executor.stop_all = lambda prefix: 0
        clock = Clock()
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected()
        handle.ledger.set_waiting("ns/e/t0", [Resources(cpu=0.5, gpu=1)])     # queued for a GPU
        clock.now += 5
        await handle.refresh_capacity()
        assert executor.requests[-1] == [{"CPU": 0.5, "GPU": 1.0}]
        handle.ledger.release("ns/e/t0")          # the Experiment finished (goal reached): dropped
        controller = ExperimentController(namespace="ns", name="e", store=None, registry=None, body=lambda: {})
        controller.ctx.platform, controller.ctx.runner = handle, SimpleNamespace(active_trials=lambda: [])
        await controller.runs.end_runs_of_finished()
        assert executor.requests[-1] == [] and controller.runs.orphans_checked
    asyncio.run(scenario())


def test_a_driver_is_not_retired_before_its_request_is_withdrawn():
    async def scenario():
        executor = ScriptedExecutor([{"CPU": 2}])
        executor.close = lambda: None
        clock = Clock()
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected()
        handle.ledger.set_waiting("ns/e/t0", [Resources(cpu=0.5, gpu=1)])
        clock.now += 5
        await handle.refresh_capacity()
        handle.mark_unavailable("connection reset")           # lost with the request standing
        working = executor.request_resources
        executor.request_resources = lambda bundles: (_ for _ in ()).throw(RayUnavailableError("10.0.0.1:6379", "down"))
        clock.now += 10
        assert not await handle.retire(handle.uses) and handle.executor is executor   # kept: retried later
        executor.request_resources = working
        clock.now += 10
        assert await handle.retire(handle.uses) and executor.requests[-1] == []
    asyncio.run(scenario())


def test_callers_during_the_first_node_types_read_share_it(monkeypatch):
    # a standby's read ahead and the new leader's refresh: one task on a busy head, not two
    import threading
    from kubetune.executors.ray import capacity
    reads, release = [], threading.Event()

    def read_node_types(timeout_s):
        reads.append(timeout_s)
        release.wait(30)
        return [{"CPU": 4.0, "GPU": 1.0}]

    monkeypatch.setattr(capacity, "read_node_types", read_node_types)
    types = capacity.NodeTypes("10.0.0.1:6379", rpc_timeout_s=10)
    answers: list = []
    callers = [threading.Thread(target=lambda: answers.append(types.get())) for _ in range(3)]
    for caller in callers:
        caller.start()
    release.set()
    for caller in callers:
        caller.join(30)
    assert answers == [[Resources(cpu=4, gpu=1)]] * 3 and len(reads) == 1


def test_a_cluster_that_cannot_grow_is_asked_nothing():
    # request_resources was sent at every change of demand to a fixed-size cluster too: a
    # Ray call under the platform's lock that 200 Experiments' cycles waited behind (issue 26)
    async def scenario():
        clock, executor = Clock(), ScriptedExecutor([{"CPU": 2}])
        executor.node_types = lambda: None          # a cluster without an autoscaler
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected()
        ledger = handle.ledger
        assert ledger.growth_known and not ledger.autoscaling
        assert ledger.try_acquire("ns/e/t0", [Resources(cpu=2)])
        ledger.set_waiting("ns/e/t1", [Resources(cpu=1)])
        clock.now += 5
        await handle.refresh_capacity()
        assert await handle.sync_autoscaler_request()
        assert executor.requests == []
    asyncio.run(scenario())


def test_one_capacity_refresh_in_flight_and_the_other_cycles_do_not_wait_for_it():
    async def scenario():
        clock, executor = Clock(), ScriptedExecutor([{"CPU": 2}])
        handle = RayPlatform("10.0.0.1:6379", lambda address: executor, clock=clock)
        assert await handle.ensure_connected()
        reads, answer = [], threading.Event()
        read = executor.cluster_resources

        def slow_read():
            reads.append(1)
            answer.wait(30)
            return read()
        executor.cluster_resources = slow_read
        clock.now += 5
        first = asyncio.create_task(handle.refresh_capacity())
        await until(lambda: reads, "the first refresh reads the cluster")
        await asyncio.wait_for(handle.refresh_capacity(), 10)     # another cycle: it does not wait
        assert len(reads) == 1 and not first.done()
        answer.set()
        await first
        assert len(reads) == 1
    asyncio.run(scenario())
