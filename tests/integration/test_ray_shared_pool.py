"""Idle pooled workers and the ledger agree on what is free when Experiments share a
Ray cluster (issue 26: 100 Experiments on 2 CPUs, capacity idle while 198 trials
waited).  The ledger counts an idle worker's resources as free (cluster_resources), so
it grants them to another Experiment's trial, whose new actor Ray holds back until the
idle worker is gone: the pool must make that room at once, not after ``idle_ttl_s``.

The trials ask for half of the head's memory resource (and no CPU), so exactly two fit
whatever other tests of the session hold in CPUs."""
from __future__ import annotations

import uuid

import pytest
import ray

from kubetune.executors.base import LaunchRequest
from kubetune.executors.ray.executor import RayExecutor
from kubetune.spec.model import TrialResources

from test_ray_executor import QUADRATIC, SLEEPY, Tracker

pytestmark = pytest.mark.integration

TTL = 600.0     # an idle worker expiring would free the room too: far beyond every deadline here
DEADLINE = 90.0


@pytest.fixture
def executor(ray_local):
    executor = RayExecutor(ray_local, idle_ttl_s=TTL)
    executor.connect()
    prefixes = [f"it/share{uuid.uuid4().hex[:6]}-{i}/" for i in range(2)]
    yield executor, prefixes
    for prefix in prefixes:
        executor.stop_all(prefix)


def _half_of_the_memory() -> TrialResources:
    return TrialResources(cpu=0.0, memory=float(int(ray.cluster_resources()["memory"] // 2)))


def _start(executor: RayExecutor, key: str, shape: TrialResources, config: dict, entrypoint: str = QUADRATIC):
    return executor.start(LaunchRequest(trial_key=key, entrypoint=entrypoint, config=config, resources=shape))


def test_a_slot_freed_by_one_experiment_runs_the_next_experiments_trial(executor):
    """The order the operator produces when Experiment A's trial ends: the ledger frees
    its slot on the result, B's cycle starts a trial there (a new actor: A's worker
    cannot host B's trial), and only then does A's cycle stop the ended trial, whose
    worker goes back to A's idle pool."""
    executor, (a, b) = executor
    shape = _half_of_the_memory()
    tracker = Tracker(executor)
    _start(executor, f"{a}t-0", shape, {"x": 1, "y": 0})
    _start(executor, f"{a}t-1", shape, {"iterations": 10_000, "interval": 0.05}, SLEEPY)
    tracker.until_done(f"{a}t-0", timeout=DEADLINE)
    _start(executor, f"{b}t-0", shape, {"x": 2, "y": 0})
    executor.stop(f"{a}t-0")
    assert tracker.until_done(f"{b}t-0", timeout=DEADLINE).results, "B's trial never ran"


def test_trials_granted_the_room_of_idle_workers_all_run(executor):
    """Both slots are held by A's idle workers, both granted to B's trials at once."""
    executor, (a, b) = executor
    shape = _half_of_the_memory()
    tracker = Tracker(executor)
    for i in range(2):
        _start(executor, f"{a}t-{i}", shape, {"x": i, "y": 0})
    for i in range(2):
        tracker.until_done(f"{a}t-{i}", timeout=DEADLINE)
        executor.stop(f"{a}t-{i}")
    total, available, _ = executor.cluster_resources()
    assert available["memory"] >= 2 * shape.memory     # the ledger's view: the idle room is free
    for i in range(2):
        _start(executor, f"{b}t-{i}", shape, {"x": i, "y": 1})
    for i in range(2):
        assert tracker.until_done(f"{b}t-{i}", timeout=DEADLINE).results
