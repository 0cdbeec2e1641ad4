"""RayExecutor against a real local Ray head: history, failures, stop, re-attach,
checkpoints, a killed worker, placement groups, logs, actor reuse."""
from __future__ import annotations

import os
import signal
import uuid

import pytest
import ray

from kubetune.examples.quadratic import bowl
from kubetune.executors.base import LaunchRequest, TrialState
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.executors.ray.executor import ACTOR_PREFIX, RayExecutor, actor_name
from kubetune.spec.model import TrialResources

from kube_fixtures import wait_for

pytestmark = pytest.mark.integration

QUADRATIC = "kubetune.examples.quadratic:train"
FLAKY = "kubetune.examples.flaky:train"
SLEEPY = "kubetune.examples.sleepy:train"
SMALL = TrialResources(cpu=0.5)


class Tracker:
    """Polls like the controller does: keeps a cursor and the history per trial."""

    def __init__(self, executor: RayExecutor):
        self.executor = executor
        self.cursor: dict[str, int] = {}
        self.history: dict[str, list] = {}
        self.last: dict = {}

    def poll(self, *keys: str):
        updates = self.executor.poll({k: self.cursor.get(k, 0) for k in keys})
        for key, update in updates.items():
            seqs = [r.seq for r in update.results]
            assert seqs == list(range(self.cursor.get(key, 0) + 1,
                                      self.cursor.get(key, 0) + 1 + len(seqs))), seqs
            self.history.setdefault(key, []).extend(update.results)
            if seqs:
                self.cursor[key] = seqs[-1]
            self.last[key] = update
        return updates

    def until(self, key: str, predicate, timeout: float = 60.0):
        return wait_for(lambda: predicate(self.poll(key)[key]) and self.last[key],
                        timeout=timeout, message=f"{key}: {self.last.get(key)}")

    def until_done(self, key: str, timeout: float = 60.0):
        return self.until(key, lambda u: u.state.is_terminal, timeout)


@pytest.fixture
def experiment(ray_local):
    """A fresh experiment prefix; every actor under it is removed afterwards."""
    prefix = f"it/x{uuid.uuid4().hex[:8]}/"
    yield prefix
    RayExecutor(ray_local).stop_all(prefix)


@pytest.fixture(params=["pooled", "dedicated"])
def executor(request, ray_local):
    executor = RayExecutor(ray_local, reuse_actors=request.param == "pooled")
    executor.connect()
    return executor


def launch(key: str, entrypoint: str, config: dict, **kwargs) -> LaunchRequest:
    return LaunchRequest(trial_key=key, entrypoint=entrypoint, config=config,
                         resources=kwargs.pop("resources", SMALL), **kwargs)


def test_history_equals_what_the_functions_reported(executor, experiment):
    params = {f"{experiment}t-{i}": {"x": i * 0.5, "y": -i} for i in range(4)}
    for key, config in params.items():
        executor.start(launch(key, QUADRATIC, config))
    tracker = Tracker(executor)
    wait_for(lambda: all(u.state.is_terminal for u in tracker.poll(*params).values()),
             timeout=60, message="all trials ending")
    for key, config in params.items():
        assert tracker.last[key].state is TrialState.COMPLETED
        expected = [bowl(config["x"], config["y"]) + 1.0 / i for i in range(1, 6)]
        assert [r.metrics["val_loss"] for r in tracker.history[key]] == pytest.approx(expected)
        assert [(r.seq, r.iteration) for r in tracker.history[key]] == [(i, i) for i in range(1, 6)]
    again = executor.poll({key: 0 for key in params})   # idempotent: fetch from the start again
    assert all([r.seq for r in u.results] == [1, 2, 3, 4, 5] for u in again.values())
    assert all(u.results == () and u.state is TrialState.COMPLETED
               for u in executor.poll({key: 5 for key in params}).values())


def test_an_exception_fails_the_trial_after_its_earlier_results(ray_local, experiment):
    executor = RayExecutor(ray_local)
    key = f"{experiment}flaky-0"
    executor.start(launch(key, FLAKY, {"iterations": 6, "fail_at": 3}, storage="/tmp/unused"))
    tracker = Tracker(executor)
    final = tracker.until_done(key)
    assert final.state is TrialState.FAILED
    assert [r.iteration for r in tracker.history[key]] == [1, 2, 3]
    assert final.error.startswith("RuntimeError: flaky failure after iteration 3\n")
    assert "flaky.py" in final.error and "Traceback" in final.error


def test_stop_ends_the_function_at_its_next_report(ray_local, experiment, tmp_path):
    executor = RayExecutor(ray_local)
    key = f"{experiment}sleepy-0"
    executor.start(launch(key, SLEEPY, {"interval": 0, "hold_after": 2,
                                        "gate": str(tmp_path / "never")}))
    tracker = Tracker(executor)
    tracker.until(key, lambda u: tracker.cursor.get(key) == 2)
    name = executor.describe(key)["name"]
    final = executor.stop(key, after_seq=2, timeout_s=20)
    assert final.state is TrialState.STOPPED          # graceful: its report raised
    assert [(r.seq, r.iteration) for r in final.results] == [(3, 3)]
    assert key not in executor.list_trials(experiment)
    # The pooled worker survived the stop and hosts the next trial.
    info = executor.start(launch(f"{experiment}q-1", QUADRATIC, {"x": 1, "y": 1}))
    assert info.actor_name == name


def test_reattach_after_an_operator_restart(executor, experiment, tmp_path):
    key = f"{experiment}long-0"
    gate = tmp_path / "gate"
    request = launch(key, SLEEPY, {"interval": 0, "iterations": 6, "hold_after": 3,
                                   "gate": str(gate)})
    first = executor.start(request)
    tracker = Tracker(executor)
    tracker.until(key, lambda u: tracker.cursor.get(key) == 3)
    pid = tracker.history[key][-1].metrics["pid"]

    ray.shutdown()                                   # the operator goes away ...
    restarted = RayExecutor(executor.address, reuse_actors=executor.reuse_actors)
    restarted.connect()                              # ... and comes back, knowing nothing
    assert restarted.list_trials(experiment) == [key]
    again = restarted.start(request)
    assert again.attached and again.actor_name == first.actor_name
    gate.touch()
    resumed = Tracker(restarted)
    resumed.cursor[key] = 2                          # its last durably recorded seq
    final = resumed.until_done(key)
    assert final.state is TrialState.COMPLETED
    assert [r.seq for r in resumed.history[key]] == [3, 4, 5, 6]
    assert {r.metrics["pid"] for r in resumed.history[key]} == {pid}   # the same process
    if not executor.reuse_actors:
        assert first.actor_name == actor_name(key)


def test_a_checkpoint_is_persisted_and_restored_on_relaunch(ray_local, experiment, tmp_path):
    executor = RayExecutor(ray_local)
    key = f"{experiment}flaky-1"
    storage = str(tmp_path / "checkpoints")
    base = dict(storage=storage, keep_last=2)
    executor.start(launch(key, FLAKY, {"iterations": 5, "fail_at": 3}, **base))
    tracker = Tracker(executor)
    failed = tracker.until_done(key)
    assert failed.state is TrialState.FAILED
    checkpoint = tracker.history[key][-1].checkpoint
    trial_dir = os.path.join(storage, key)
    assert checkpoint == os.path.join(trial_dir, "checkpoint-000003")
    assert failed.checkpoint == checkpoint
    assert sorted(os.listdir(trial_dir)) == ["checkpoint-000002", "checkpoint-000003"]
    executor.stop(key)

    executor.start(launch(key, FLAKY, {"iterations": 5, "fail_at": 3}, checkpoint=checkpoint,
                          start_iteration=3, start_seq=3, attempt=1, **base))
    final = tracker.until_done(key)
    assert final.state is TrialState.COMPLETED
    assert [(r.seq, r.iteration, r.metrics["score"]) for r in tracker.history[key]] == \
        [(i, i, i) for i in range(1, 6)]                 # no gap, no duplicate
    assert [r.attempt for r in tracker.history[key]] == [0, 0, 0, 1, 1]
    # 3 is kept while the operator may still resume from it; ending the trial trims it
    executor.stop(key)
    wait_for(lambda: sorted(os.listdir(trial_dir)) == ["checkpoint-000004", "checkpoint-000005"],
             timeout=60, message="retention to keep the latest two")


def test_a_killed_worker_process_shows_as_missing(ray_local, experiment):
    executor = RayExecutor(ray_local)
    key = f"{experiment}victim-0"
    executor.start(launch(key, SLEEPY, {"interval": 0.02}))
    tracker = Tracker(executor)
    tracker.until(key, lambda u: tracker.history.get(key))
    os.kill(tracker.history[key][0].metrics["pid"], signal.SIGKILL)
    final = tracker.until_done(key)
    assert final.state is TrialState.MISSING
    assert not final.cluster_fault
    assert "died" in final.error
    executor.stop(key)                                # never raises, also for a dead trial


def test_several_bundles_get_a_placement_group(ray_local, experiment):
    executor = RayExecutor(ray_local)
    key = f"{experiment}multi-0"
    info = executor.start(launch(key, SLEEPY, {"interval": 0.02},
                                 resources=TrialResources(cpu=1, bundles=2)))
    assert info.actor_name == actor_name(key) and info.placement_group

    def group():
        return next((g for g in ray.util.placement_group_table().values()
                     if g["name"] == info.placement_group), None)

    wait_for(lambda: group()["state"] == "CREATED", timeout=60, message="placement group created")
    assert list(group()["bundles"].values()) == [{"CPU": 1.0}] * 2, group()["bundles"]
    Tracker(executor).until(key, lambda u: u.results)
    executor.stop(key)
    wait_for(lambda: group()["state"] == "REMOVED", timeout=60, message="placement group removed")
    wait_for(lambda: actor_name(key)[len(ACTOR_PREFIX):] not in
             [a["name"][len(ACTOR_PREFIX):] for a in ray.util.list_named_actors(True)],
             timeout=60, message="actor gone")


def test_logs_hold_what_the_function_printed(ray_local, experiment):
    executor = RayExecutor(ray_local)
    key = f"{experiment}chatty-0"
    executor.start(launch(key, SLEEPY, {"interval": 0.01, "iterations": 3}))
    Tracker(executor).until_done(key)
    assert executor.logs(key).splitlines()[-3:] == [f"sleepy step {i}" for i in (1, 2, 3)]


def test_idle_workers_are_reused_and_counted_as_free(ray_local, experiment):
    executor = RayExecutor(ray_local)
    tracker = Tracker(executor)
    names, pids = [], []
    for i in range(3):
        key = f"{experiment}reuse-{i}"
        names.append(executor.start(launch(key, QUADRATIC, {"x": i, "y": 0})).actor_name)
        tracker.until_done(key)
        pids.append(executor.describe(key)["pid"])
        executor.stop(key)
    assert len(set(names)) == 1 and len(set(pids)) == 1
    total, available, nodes = executor.cluster_resources()
    assert total["CPU"] == 8 and total["GPU"] == 4
    assert len(nodes) == 1 and nodes[0].total["CPU"] == 8
    # The idle worker holds 0.5 CPU in Ray, reported as free for the ledger.
    assert available["CPU"] >= ray.available_resources().get("CPU", 0) + 0.5


def test_start_is_idempotent(ray_local, experiment, tmp_path):
    executor = RayExecutor(ray_local)
    key = f"{experiment}once-0"
    request = launch(key, SLEEPY, {"hold_after": 0, "gate": str(tmp_path / "never")})
    first = executor.start(request)
    second = executor.start(request)
    assert second.attached and second.actor_name == first.actor_name
    assert len([a for a in ray.util.list_named_actors(True)
                if a["name"].startswith(ACTOR_PREFIX + experiment)]) == 1
    assert executor.stop_all(experiment) == 1
    assert executor.list_trials(experiment) == []


def test_an_unreachable_address_is_a_clear_error():
    ray.shutdown()    # later tests' executors connect again on first use
    # the cause in words (issue 32: what a user reads first names the cause)
    with pytest.raises(RayUnavailableError, match="'127.0.0.1:1'.*connection refused: nothing listens on port 1"):
        RayExecutor("127.0.0.1:1").connect()


def test_pause_stops_at_the_next_checkpoint_and_resume_continues(ray_local, experiment,
                                                                  tmp_path):
    executor = RayExecutor(ray_local)
    key = f"{experiment}pbt-0"
    storage = str(tmp_path / "checkpoints")
    executor.start(launch(key, SLEEPY, {"interval": 0.01, "iterations": 400}, storage=storage))
    tracker = Tracker(executor)
    tracker.until(key, lambda u: tracker.cursor.get(key, 0) >= 2)
    seen = tracker.cursor[key]
    paused = executor.pause(key, after_seq=seen, timeout_s=20)
    assert paused is not None
    assert paused.state is TrialState.STOPPED
    assert paused.results and paused.results[0].seq == seen + 1
    last = paused.results[-1]
    assert last.checkpoint == paused.checkpoint == os.path.join(
        storage, key, f"checkpoint-{last.iteration:06d}")
    assert all(r.checkpoint is None for r in paused.results[:-1])

    executor.start(launch(key, SLEEPY, {"interval": 0, "iterations": last.iteration + 2},
                          storage=storage, checkpoint=paused.checkpoint,
                          start_iteration=last.iteration, start_seq=last.seq, attempt=1))
    tracker.cursor[key] = last.seq
    final = tracker.until_done(key)
    assert final.state is TrialState.COMPLETED
    assert [r.iteration for r in tracker.history[key]][-2:] == [last.iteration + 1,
                                                               last.iteration + 2]


def test_an_idle_worker_nobody_uses_ends_itself(ray_local, experiment):
    executor = RayExecutor(ray_local, idle_ttl_s=0.3)
    key = f"{experiment}short-0"
    info = executor.start(launch(key, QUADRATIC, {"x": 0, "y": 0}))
    Tracker(executor).until_done(key)
    executor.stop(key)                  # back to the idle pool; then the operator is gone
    del executor
    wait_for(lambda: info.actor_name not in [a["name"] for a in ray.util.list_named_actors(True)],
             timeout=30, message="the idle worker ending itself")


def test_experiments_share_a_listing_that_hides_no_stop_and_misses_no_actor_to_end(ray_local, tmp_path):
    """One listing of the named actors serves every Experiment (named_actors.py; here it
    never expires): it finds each Experiment's actors after a restart, never shows an
    actor the executor stopped since, and ``stop_all`` asks Ray afresh, so an actor
    created after the shared listing is ended too."""
    run = uuid.uuid4().hex[:8]
    prefixes = [f"it/s{run}-{i}/" for i in range(3)]
    hold = {"hold_after": 0, "gate": str(tmp_path / "never")}
    first = RayExecutor(ray_local, reuse_actors=False)
    try:
        for prefix in prefixes:
            first.start(launch(f"{prefix}t-0", SLEEPY, hold))
        for prefix in prefixes:     # running: a restarted executor finds them at once
            wait_for(lambda key=f"{prefix}t-0": first.describe(key) is not None, timeout=120, message="actor up")
        ray.shutdown()                                   # the operator goes away and comes back
        executor = RayExecutor(ray_local, reuse_actors=False, listing_max_age_s=3600)
        assert [executor.list_trials(prefix) for prefix in prefixes] == [[f"{p}t-0"] for p in prefixes]
        assert executor._named.fetches == 1              # one listing for every Experiment
        late = f"{prefixes[0]}t-1"
        executor.start(launch(late, SLEEPY, hold))       # created after the shared listing
        assert executor.stop(f"{prefixes[1]}t-0", timeout_s=5) is not None
        assert executor.list_trials(prefixes[1]) == []
        assert executor._discovery.actor_names(prefixes[1]) == []     # shared, yet not shown alive
        assert executor.poll({f"{prefixes[1]}t-0": 0})[f"{prefixes[1]}t-0"].state is TrialState.MISSING
        assert executor._named.fetches == 1
        assert executor.stop_all(prefixes[0]) == 2       # the late actor included
        wait_for(lambda: executor.remaining(prefixes[0]) == 0, timeout=60, message="actors ended")
        with pytest.raises(ValueError):
            ray.get_actor(ACTOR_PREFIX + late, namespace=f"kubetune/{prefixes[0].rstrip('/')}")
    finally:
        for prefix in prefixes:
            RayExecutor(ray_local).stop_all(prefix)
