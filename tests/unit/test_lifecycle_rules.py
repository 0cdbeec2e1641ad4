"""Lifecycle rules without a cluster (issue 15). The integration tests (test_lifecycle,
test_deletion) show each through the operator; these pin down the rules, and the one
case a local Ray head cannot stage: Ray unreachable while the trials still run (when a
single-node head is down, its actors are too), so the retry is shown here."""
from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

import pytest

from kubetune.executors.platform import PlatformRegistry
from kubetune.executors.ray.platform import RayAddressRefused, RayPlatforms
from kubetune.controller.merge_patch import merge_patch
from kubetune.controller.operator_state import CleanupPending, OperatorState
from kubetune.controller import restore
from kubetune.controller.restore import finished_and_unchanged, outcome
from kubetune.core.simulate import Simulator
from kubetune.core.types import CreateTrial, FinishExperiment
from kubetune.trainable.host import TrialHost
from unit_helpers import make_runner, make_spec, quadratic, records_of
from ray_fakes import FakeRayConnection


def test_merge_patch_nulls_what_the_new_status_no_longer_has():
    before = {"phase": "Succeeded", "completionTime": "t", "bestTrial": {"name": "a", "iteration": 3},
              "gone": None}
    after = {"phase": "Running", "bestTrial": {"name": "a"}}
    assert merge_patch(before, after) == {"phase": "Running", "completionTime": None,
                                          "bestTrial": {"name": "a", "iteration": None}}


def succeeded(reason: str, generation: int) -> dict:
    return {"phase": "Succeeded", "observedGeneration": generation,
            "conditions": [{"type": "Succeeded", "status": "True", "reason": reason, "message": "m"}]}


def test_a_finished_status_is_read_back_as_the_runs_outcome():
    assert outcome(succeeded("GoalReached", 1)) == FinishExperiment("Succeeded", "GoalReached", "m")
    assert finished_and_unchanged(succeeded("GoalReached", 1), 1)
    assert not finished_and_unchanged(succeeded("GoalReached", 1), 2)      # the spec changed since
    invalid = {"phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec"}]}
    assert outcome(invalid) is None          # the controller's refusal, not how a run ended
    assert outcome({"phase": "Running", "conditions": []}) is None


@pytest.mark.parametrize("reason, spec_changed, max_trials, reopens", [
    ("GoalReached", False, 4, False), ("GoalReached", True, 8, False),
    ("MaxTrialsReached", False, 8, False), ("MaxTrialsReached", True, 2, False),
    ("MaxTrialsReached", True, 4, True), ("Infeasible", False, 4, False), ("Infeasible", True, 4, True),
])
def test_a_restored_finished_run_starts_nothing_unless_its_spec_reopens_it(reason, spec_changed, max_trials,
                                                                           reopens):
    first = make_runner(make_spec(scheduler={"maxIterations": 3}, budget={"maxTrials": 2, "parallelism": 1}))
    Simulator(first, quadratic).run()
    runner = make_runner(make_spec(scheduler={"maxIterations": 3}, budget={"maxTrials": max_trials, "parallelism": 1}))
    runner.restore(records_of(first))
    runner.restore_outcome(FinishExperiment("Succeeded", reason, ""), spec_changed=spec_changed)
    created = [d for d in runner.step(100.0) if isinstance(d, CreateTrial)]
    assert bool(created) is reopens and (runner.finished is None) is reopens


def test_registry_connects_each_address_on_its_own():
    made = []
    registry = RayPlatforms("ray://head:10001", lambda address: made.append(("own", address)),
                               allow_local=False, separate_factory=lambda address, token_env="": made.append(("separate", address)))
    typo = registry.get("ray://typo:10001")
    own = registry.get(registry.resolve(None))
    assert own.address == "ray://head:10001" and typo.address == "ray://typo:10001" and own is not typo
    assert own.ledger is not typo.ledger       # each cluster its own capacity
    assert registry.get("ray://typo:10001") is typo
    # only the operator's own address uses this process's driver; connections are made lazily
    assert made == []
    own._executor_factory(own.address), typo._executor_factory(typo.address)
    assert made == [("own", "ray://head:10001"), ("separate", "ray://typo:10001")]
    with pytest.raises(RayAddressRefused, match="--allow-local-ray"):
        registry.get("local")
    assert RayPlatforms("local", lambda address: object()).get("local").address == "local"
    # `kubetune run` (no separate drivers): its one address only
    with pytest.raises(RayAddressRefused, match="kubetune operator"):
        RayPlatforms("local", lambda address: object()).get("ray://head:10001")


class FlakyRay(FakeRayConnection):
    """A Ray cluster that is unreachable for a while, then kills actors one call late."""

    def __init__(self, unreachable: int) -> None:
        self.unreachable = unreachable
        self.alive = {"ns/e/e-0", "ns/e/e-1"}
        self.calls = 0

    def connect(self) -> None:
        if self.unreachable:
            self.unreachable -= 1
            raise ConnectionError("no route to head")

    def cluster_resources(self):
        return SimpleNamespace(total={"CPU": 4.0}, nodes=[])

    def request_resources(self, bundles) -> None:
        pass

    def stop_all(self, prefix: str) -> int:
        self.calls += 1
        if self.calls > 1:          # the first kill is lost on the way
            self.alive = {key for key in self.alive if not key.startswith(prefix)}
        return 2

    def remaining(self, prefix: str) -> int:
        return sum(key.startswith(prefix) for key in self.alive)


class TrialList:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    async def list_trials(self) -> list[dict]:
        return [{"metadata": {"name": name}} for name in self.names]


def test_deletion_is_retried_until_the_trials_are_gone():
    ray = FlakyRay(unreachable=1)
    registry = RayPlatforms("ray://head:10001", lambda address: ray)
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: TrialList(["e-0", "e-1"]), checkpoint_storage="")
    body = {"metadata": {"name": "e", "namespace": "ns"}, "spec": {}}

    async def attempts() -> list[str]:
        outcomes = []
        handle = registry.get("ray://head:10001")
        for _ in range(5):
            handle._reconnect.retry_at = float("-inf")   # kopf's retry delay has passed
            try:
                await state.delete("ns", "e", body)
            except CleanupPending as error:
                outcomes.append(str(error))
                continue
            outcomes.append("done")
            break
        return outcomes

    outcomes = asyncio.run(attempts())
    assert outcomes[-1] == "done" and len(outcomes) == 3, outcomes
    assert "no route to head" in outcomes[0] and "2 runs of ns/e are still alive" in outcomes[1]
    assert ray.alive == set()


def test_deleting_an_experiment_on_an_address_never_reached_is_not_held_up():
    # a typo'd spec.ray.address: no Trial was ever created, so nothing ran there to end
    registry = RayPlatforms("ray://head:10001", lambda address: FlakyRay(0),
                               separate_factory=lambda address, token_env="": FlakyRay(unreachable=100))
    body = {"metadata": {"name": "e", "namespace": "ns"}, "spec": {"ray": {"address": "ray://typo:10001"}}}
    asyncio.run(OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: TrialList([]), checkpoint_storage="")
                .delete("ns", "e", body))
    with pytest.raises(CleanupPending, match="no route to head"):   # with Trials, it waits for Ray
        registry.get("ray://typo:10001")._reconnect.retry_at = float("-inf")
        asyncio.run(OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: TrialList(["e-0"]), checkpoint_storage="")
                    .delete("ns", "e", body))


def test_a_deletion_past_its_cleanup_timeout_still_lets_go_of_what_the_operator_held():
    """AUDIT N14: Ray unreachable past the cleanup timeout.  Giving up must still release the
    Experiment's ledger holdings, forget its controller and its stored results."""
    from kubetune.controller.store import MemoryStore

    class Writer:
        forgotten: list[str] = []

        def forget_experiment(self, uid: str) -> None:
            self.forgotten.append(uid)

    registry = RayPlatforms("ray://head:10001", lambda address: FlakyRay(unreachable=100))
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: TrialList(["e-0"]), checkpoint_storage="",
                          results=Writer())
    body = {"metadata": {"name": "e", "namespace": "ns", "uid": "u1"}, "spec": {}}
    state._store_factory = lambda *_: MemoryStore()
    controller = state.controller_for("ns", "e", body)
    state._store_factory = lambda *_: TrialList(["e-0"])
    released = []

    async def release() -> None:
        released.append(True)
    controller.release_resources = release
    with pytest.raises(CleanupPending):            # within the timeout: retried, nothing let go
        asyncio.run(state.delete("ns", "e", body))
    assert not released and ("ns", "e") in state.controllers and Writer.forgotten == []
    registry.get("ray://head:10001")._reconnect.retry_at = float("-inf")
    with pytest.raises(CleanupPending):            # past it: still unreachable, but let go
        asyncio.run(state.delete("ns", "e", body, give_up=True))
    assert released == [True] and ("ns", "e") not in state.controllers and Writer.forgotten == ["u1"]


def test_a_running_trial_nobody_calls_ends_with_its_lease():
    import time

    lease = 2.0    # twenty times the gap between calls below, so a loaded machine's pauses do not end it
    ended = threading.Event()
    host = TrialHost("w", capture_output=False, idle_timeout_s=0.05, on_idle=ended.set, lease_timeout_s=lease)
    host.assign({"trial_key": "ns/e/a", "entrypoint": "kubetune.examples.sleepy:train", "config": {"interval": 0.01},
                 "checkpoint": None, "start_iteration": 0, "start_seq": 0, "attempt": 0, "storage": "",
                 "keep_last": 2})
    calling_until = time.monotonic() + 3 * lease
    while time.monotonic() < calling_until:    # its controller keeps calling: it runs on past the lease
        host.fetch("ns/e/a", 0)
        assert not ended.wait(0.1)
    assert host.describe()["state"] == "running"
    assert ended.wait(30.0)      # nobody calls any more
    assert host.describe()["state"] != "running"


@pytest.mark.parametrize("scheduler", [{"type": "asha", "maxIterations": 2000, "gracePeriod": 2},
                                       {"type": "hyperband", "maxIterations": 2000}])
def test_a_successive_halving_restore_replays_only_its_rungs_and_rebuilds_the_same_state(scheduler, monkeypatch):
    from kubetune.core import curve
    from kubetune.core.schedulers.base import PrunerScheduler
    from kubetune.core.types import TrialRecord

    spec = make_spec(scheduler=scheduler, budget={"maxTrials": 6, "parallelism": 6})
    first = make_runner(spec)
    Simulator(first, quadratic).run()
    # from the bounded Trial status (decisionState holds the rung values): no replay at all
    bounded = make_runner(spec)
    bounded.restore(records_of(first))
    assert bounded.scheduler._rung_values == first.scheduler._rung_values

    # Trials written before decisionState existed: their whole history, replayed
    monkeypatch.setattr(curve, "CURVE_POINTS", 10 ** 9)
    legacy = make_runner(spec)
    Simulator(legacy, quadratic).run()
    records = [TrialRecord(name=t.name, index=t.index, params=dict(t.params), phase=t.phase,
                           history=tuple(t.history), iteration=t.iteration, last_result_seq=t.last_seq)
               for t in legacy.trials.values()]
    assert sum(len(r.history) for r in records) > 2000

    def restored(every_step: bool):
        """The restored scheduler and how many prefixes of a history it had to judge:
        each judgement copies the history before it, so their count is the cost."""
        runner = make_runner(spec)
        if every_step:     # the old replay: each step, with a copy of all before it
            runner.scheduler.replay_step = lambda previous, step: PrunerScheduler.replay_step(
                runner.scheduler, previous, step)
        judged = []
        prune = runner.scheduler.prune
        runner.scheduler.prune = lambda frozen: judged.append(len(frozen.intermediate_values)) or prune(frozen)
        runner.restore(records)
        return runner.scheduler, judged

    fast, fast_judged = restored(False)
    full, full_judged = restored(True)
    assert fast._rung_values == full._rung_values == legacy.scheduler._rung_values
    assert {k: [e.system_attrs for e in v] for k, v in fast._reached.items()} == \
        {k: [e.system_attrs for e in v] for k, v in full._reached.items()}
    # the old replay judged every step; the rung-only one at most one step per rung per trial
    history = sum(len(r.history) for r in records)
    assert len(full_judged) == history
    rungs = len(fast._rung_values)          # (bracket, rung) pairs
    assert 0 < len(fast_judged) <= len(records) * (rungs + 1) < history // 10


def test_a_recreated_experiment_gets_a_fresh_controller():
    from kubetune.controller.store import MemoryStore
    state = OperatorState(PlatformRegistry({"ray": RayPlatforms("local", lambda address: object())}),
                          store_factory=lambda *_: MemoryStore(), checkpoint_storage="")
    old = state.controller_for("ns", "e", {"metadata": {"name": "e", "uid": "u1"}})
    assert state.controller_for("ns", "e", {"metadata": {"name": "e", "uid": "u1"}}) is old
    new = state.controller_for("ns", "e", {"metadata": {"name": "e", "uid": "u2"}})
    assert new is not old and old._stopping and not new._stopping


def test_a_merge_patch_applied_as_the_api_server_does_gives_the_new_status():
    from kubetune.controller.merge_patch import apply_merge_patch
    before = {"phase": "Running", "lastMetrics": {"loss": 1.0, "iteration": 3}, "history": [{"loss": 1.0}],
              "checkpoint": "/c/3"}
    after = {"phase": "Running", "history": [], "checkpoint": "/c/3"}      # a retry from scratch
    stored = {**before}
    apply_merge_patch(stored, merge_patch(before, after))
    assert stored == after


def test_restores_wait_their_turn_in_every_event_loop():
    # more restores than CONCURRENT_RESTORES at once make some wait on the semaphore;
    # a second event loop in the same process (a test, a benchmark) must work as well
    spec = make_spec()
    gate: list[asyncio.Event] = []

    async def listing() -> list[dict]:
        await gate[0].wait()
        return []

    async def restores() -> int:
        gate[:] = [asyncio.Event()]
        pending = [asyncio.create_task(restore.rebuild(
            spec, experiment="e", owner="ns/e/", start_time=0.0, status=STARTED, generation=1, list_trials=listing))
            for _ in range(restore.CONCURRENT_RESTORES + 2)]
        await asyncio.sleep(0)
        gate[0].set()
        return len(await asyncio.gather(*pending))

    assert asyncio.run(restores()) == asyncio.run(restores()) == restore.CONCURRENT_RESTORES + 2


STARTED = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}


def test_a_new_experiment_does_not_wait_behind_the_restores_of_others():
    # 200 Experiments applied at once: each new one was built two at a time behind the
    # others (an empty LIST, an empty replay), and the last reached the shared queue
    # after the first had taken the whole cluster (issue 26)
    spec = make_spec()
    listed: list[str] = []

    async def run() -> list[str]:
        gate = asyncio.Event()

        def listing(name: str, wait: bool):
            async def list_trials() -> list[dict]:
                listed.append(name)
                if wait:
                    await gate.wait()
                return []
            return list_trials

        restarted = [asyncio.create_task(restore.rebuild(
            spec, experiment=f"old{i}", owner=f"ns/old{i}/", start_time=0.0, status=STARTED, generation=1,
            list_trials=listing(f"old{i}", True))) for i in range(restore.CONCURRENT_RESTORES + 1)]
        new = asyncio.create_task(restore.rebuild(
            spec, experiment="new", owner="ns/new/", start_time=0.0, status={}, generation=1,
            list_trials=listing("new", False)))
        for _ in range(10):       # loop turns, no time: every task runs up to where it waits
            await asyncio.sleep(0)
        seen = list(listed)       # while the restores hold every slot
        gate.set()
        runner, _ = await new
        assert runner.experiment == "new"
        await asyncio.gather(*restarted)
        return seen

    seen = asyncio.run(run())
    assert "new" in seen and len([n for n in seen if n.startswith("old")]) == restore.CONCURRENT_RESTORES


def test_a_pod_queued_by_the_platform_keeps_its_slot_across_a_restart():
    # a launched pod the kube-scheduler cannot place shows as Queued; a restarted operator
    # must read it as launched (running, holding its slot), not as a trial never launched
    from kubetune.controller import render
    from kubetune.controller.platform_queue import PlatformQueue
    from kubetune.core.types import LaunchTrial, TrialPhase
    spec = make_spec(budget={"maxTrials": 3, "parallelism": 1})
    runner = make_runner(spec)
    [launch] = [d for d in runner.step(0.0) if isinstance(d, LaunchTrial)]
    runner.on_trial_launched(launch.name, 0.0)
    queue = PlatformQueue()
    queue.note(launch.name, "Unschedulable", "0/1 nodes are available: 1 Insufficient nvidia.com/gpu")
    trial = runner.trials[launch.name]
    written = queue.trial_status(launch.name, render.trial_status(trial, objective="loss"))
    assert written["phase"] == "Queued" and "Insufficient" in written["message"]     # what users see
    body = {"metadata": {"name": launch.name}, "spec": {"index": trial.index, "parameters": dict(trial.params)},
            "status": json.loads(json.dumps(written))}
    restored = make_runner(spec)
    restored.restore([render.trial_record(body)])
    assert restored.trials[launch.name].phase is TrialPhase.RUNNING
    assert not [d for d in restored.step(1.0) if isinstance(d, LaunchTrial)]     # parallelism 1 is taken


def test_results_lost_in_a_restart_are_fetched_again_after_a_failed_fetch():
    # the check for results the killed operator took but never stored is retried until
    # it holds, like every other effect: a fetch failing once (Ray unreachable) loses nothing
    from kubetune.controller.experiment import ExperimentController
    from kubetune.core.types import Result
    from kubetune.executors.base import TrialState, TrialUpdate
    from kubetune.executors.platform import ExecutorPlatform
    from kubetune.executors.ray.errors import RayUnavailableError

    class Store:     # the ResultsRecorder, and its writer
        def __init__(self) -> None:
            self.recorded: list[int] = []
            self.writer = self

        def stored_through(self, names):
            return {name: 1 for name in names}

        def uid(self, name):
            return f"uid-{name}"

        def submit(self, batch):
            assert {row.trial_uid for row in batch.results} == {"uid-e-0"}
            self.recorded += [row.seq for row in batch.results]

    class Ray:
        calls = 0

        def poll(self, cursors, wait_s=0.0):
            self.calls += 1
            if self.calls == 1:
                raise RayUnavailableError("ray://head:10001", "connection refused")
            [(key, after)] = cursors.items()
            return {key: TrialUpdate(key, TrialState.RUNNING, tuple(
                Result(seq=seq, iteration=seq + 1, metrics={"loss": 1.0}, timestamp=0.0) for seq in range(after + 1, 5)))}

    controller = ExperimentController(namespace="ns", name="e", store=None, registry=None, body=lambda: {})
    platform = ExecutorPlatform()
    platform.executor = Ray()
    controller.ctx.results, controller.ctx.platform = Store(), platform
    controller.pump.unstored = {"e-0": 3}
    with pytest.raises(RayUnavailableError):
        asyncio.run(controller.pump.store_results_taken_before_restart())
    asyncio.run(controller.pump.store_results_taken_before_restart())
    assert controller.results.recorded == [2, 3] and controller.pump.unstored == {}


class Driver(FakeRayConnection):
    """A separate address's executor as the registry sees it: connect, close."""

    def __init__(self, made: list) -> None:
        self.closed = False
        self.requests: list = []
        made.append(self)

    def connect(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def cluster_resources(self):
        return SimpleNamespace(total={"CPU": 4.0}, nodes=[])

    def request_resources(self, bundles) -> None:
        self.requests.append(bundles)

    def stop_all(self, prefix: str) -> int:
        return 0

    def remaining(self, prefix: str) -> int:
        return 0


def test_a_driver_nobody_needs_ends_after_the_grace_period_and_a_new_one_starts_when_needed():
    made: list[Driver] = []
    now = [0.0]
    registry = RayPlatforms("ray://own:10001", lambda address: Driver([]), idle_s=60.0, clock=lambda: now[0],
                               separate_factory=lambda address, token_env="": Driver(made))
    other, own = registry.get("ray://other:10001"), registry.get("ray://own:10001")

    async def scenario() -> None:
        assert await other.ensure_connected() and await own.ensure_connected()
        assert await registry.retire_idle({"ray://other:10001"}) == []          # in use
        now[0] = 100.0
        assert await registry.retire_idle(set()) == []       # idle from now on, not before
        now[0] = 130.0
        await other.ensure_connected()                        # used meanwhile (a deletion's cleanup)
        now[0] = 170.0
        assert await registry.retire_idle(set()) == [] and not made[0].closed   # its window restarted
        now[0] = 230.0
        assert await registry.retire_idle(set()) == ["ray://other:10001"]
        assert made[0].closed and other.executor is None and not other.last_error
        assert other.retired         # not counted as a Ray outage (metrics: kubetune_ray_connected)
        assert own.executor is not None                       # the operator's own driver stays
        now[0] = 1000.0
        assert await registry.retire_idle(set()) == []        # idempotent: nothing left to end
        # an Experiment names the address again: a new driver process, at once
        assert await other.ensure_connected() and len(made) == 2 and not made[1].closed and not other.retired
        assert registry.get("ray://other:10001") is other
    asyncio.run(scenario())


def test_an_experiment_being_deleted_keeps_its_driver():
    made: list[Driver] = []
    now = [0.0]
    registry = RayPlatforms("ray://own:10001", lambda address: Driver([]), idle_s=10.0, clock=lambda: now[0],
                               separate_factory=lambda address, token_env="": Driver(made))
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: TrialList([]), checkpoint_storage="")
    body = {"metadata": {"name": "e", "namespace": "ns"}, "spec": {"ray": {"address": "ray://other:10001"}}}

    async def scenario() -> None:
        assert await registry.get("ray://other:10001").ensure_connected()
        state._deleting["ray://other:10001"] = 1              # a deletion cleaning up right now
        await state.retire_idle_drivers()
        now[0] = 50.0
        assert await state.retire_idle_drivers() == []
        del state._deleting["ray://other:10001"]
        await state.retire_idle_drivers()
        now[0] = 100.0
        assert await state.retire_idle_drivers() == ["ray://other:10001"] and made[0].closed
        await state.delete("ns", "e", body)                   # deleted later: a driver for the cleanup only
        assert len(made) == 2 and state.connections_in_use() == set()
    asyncio.run(scenario())


def test_an_experiment_is_starting_on_its_clusters_ledger_until_its_first_cycle_ended():
    # from its daemon's start: Experiments applied together each get a first trial before
    # any gets a second (core/fair_share.py); then nothing is kept for it, whatever its
    # first cycle did (here: a spec it refuses)
    from kubetune.controller.store import MemoryStore
    registry = RayPlatforms("local", lambda address: object())
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: MemoryStore(),
                          checkpoint_storage="")
    ledger = registry.get("local").ledger
    seen: list[bool] = []

    def stopped() -> bool:      # asked before each cycle
        seen.append("ns/e/" in ledger._starting)
        return len(seen) > 3

    asyncio.run(state.serve("ns", "e", {"metadata": {"name": "e", "uid": "u1", "generation": 1},
                                        "spec": {"searchSpace": "not a mapping"}}, stopped))
    assert seen[:2] == [True, True] and not any(seen[2:]) and "ns/e/" not in ledger._starting


def test_an_experiment_that_found_its_cluster_unreachable_stays_starting_until_it_asks():
    # a first cycle that could not reach Ray asked for nothing: the others must not take a
    # second trial each meanwhile (under load 30-50 they did, and it waited 200 s)
    from kubetune.controller.store import MemoryStore
    ray = FlakyRay(unreachable=1)
    registry = RayPlatforms("ray://head:10001", lambda address: ray)
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: MemoryStore(),
                          checkpoint_storage="")
    ledger = registry.get("ray://head:10001").ledger
    seen: list[bool] = []

    def stopped() -> bool:      # asked before each cycle; the retry comes after a 1 s backoff
        seen.append("ns/e/" in ledger._starting)
        return ray.unreachable == 0 and not seen[-1] or len(seen) > 2000

    body = {"metadata": {"name": "e", "uid": "u1", "generation": 1},
            "spec": {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"x": {"uniform": [0.0, 1.0]}},
                     "trial": {"entrypoint": "m:f"}, "budget": {"maxTrials": 2, "parallelism": 1}}}
    asyncio.run(state.serve("ns", "e", body, stopped))
    assert seen[:3] == [True, True, True] and seen[-1] is False and len(seen) <= 2000


@pytest.mark.parametrize("restored", [False, True])
def test_an_experiment_that_ran_before_is_not_kept_room_for_while_it_is_restored(restored):
    # after a restart every Experiment is restored at once; its running trials are adopted
    # as it is restored, and keeping a first trial's room for each (everyone's second
    # trial held) through all the restores left the cluster idle (issue 26, S3)
    from kubetune.controller.store import MemoryStore
    registry = RayPlatforms("ray://head:10001", lambda address: FlakyRay(unreachable=0))
    state = OperatorState(PlatformRegistry({"ray": registry}), store_factory=lambda *_: MemoryStore(),
                          checkpoint_storage="")
    ledger = registry.get("ray://head:10001").ledger
    kept: list[str] = []
    ledger.starting = kept.append
    cycles: list[bool] = []

    def stopped() -> bool:      # asked before each cycle
        cycles.append(True)
        return len(cycles) > 2

    body = {"metadata": {"name": "e", "uid": "u1", "generation": 1},
            "spec": {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"x": {"uniform": [0.0, 1.0]}},
                     "trial": {"entrypoint": "m:f"}, "budget": {"maxTrials": 2, "parallelism": 1}},
            **({"status": {"startTime": "2026-11-27T00:00:00Z", "phase": "Running"}} if restored else {})}
    asyncio.run(state.serve("ns", "e", body, stopped))
    assert (kept == []) if restored else ("ns/e/" in kept), kept
