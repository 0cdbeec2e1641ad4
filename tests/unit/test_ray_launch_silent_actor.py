"""A restarted operator must not run a trial twice (issue 26).

The killed operator's pooled worker may still be starting; its constructor starts the
trial it was given.  Until that actor has said what it hosts, a launch of a trial of its
Experiment is deferred (``LaunchDeferred``: the trial stays Queued, the effect is tried
again, the platform is not unavailable), and no second actor is made for it.  Then it is
attached to, or launched as usual; an actor silent past the bound is killed first.

The executor's own ``TrialSlots`` and ``ActorDiscovery``; Ray is replaced at its edges
(the named-actor listing, ``get_actor``, a call's ref, ``ray.wait``, the answer read)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from kubetune.controller.store import MemoryStore
from kubetune.core.failures import FailureKind
from kubetune.core.types import LaunchTrial, TrialPhase
from kubetune.executors.base import (ExecutorError, LaunchDeferred, LaunchInfo, LaunchRequest,
                                     PlatformUnavailableError, TrialState)
from kubetune.executors.ray import discovery as discovery_module, driver_wire, slots as slots_module
from kubetune.executors.ray.discovery import ActorDiscovery, actor_group
from kubetune.executors.ray.named_actors import NamedActors
from kubetune.executors.ray.pool import Worker, WorkerPool
from kubetune.executors.ray.slots import Slot, TrialSlots
from kubetune.spec.model import TrialResources
from unit_helpers import controller_with_runner

BASE = "kubetune"
OLD_WORKER = "kubetune/ns/exp/#w-0123456789-aaaaaaaa"    # the killed operator's, still starting
KEY = "ns/exp/exp-3"


class FakeRay:
    """The Ray calls the launch path makes, answered as the test says."""

    def __init__(self) -> None:
        self.answers: dict[str, dict] = {}     # actor name -> its describe answer, once it gave one
        self.created: list[str] = []           # trial keys a new actor was made for
        self.killed: list[str] = []
        self.groups_removed: list[str] = []
        self.listed = [OLD_WORKER]             # the named actors of the experiment

    @staticmethod
    def handle(name: str):
        class Method:     # a call's ref names its actor: ``ready`` answers by actor
            def remote(self, answer_to, *args, **kwargs):
                return f"ref:{name}"

        class Handle:
            describe = Method()
            assign = Method()
            actor = name

        return Handle()

    def get_actor(self, name: str, namespace: str):
        return self.handle(name)

    def ready(self, calls, timeout_s, num_returns=None):
        return {c.ref for c in calls if c.ref[len("ref:"):] in self.answers}

    def read(self, done):
        return self.answers[done.ref[len("ref:"):]]


@pytest.fixture
def ray_parts(monkeypatch):
    fake = FakeRay()
    monkeypatch.setattr(discovery_module.ray, "get_actor", fake.get_actor)
    monkeypatch.setattr(discovery_module, "ready", fake.ready)
    monkeypatch.setattr(discovery_module, "read", fake.read)
    monkeypatch.setattr(slots_module, "ready", fake.ready)
    lock = threading.RLock()
    held: dict[str, Slot] = {}
    pool = WorkerPool(lock, address="10.0.0.1:6379", namespace=BASE, reuse_actors=True, idle_ttl_s=60.0,
                      orphan_timeout_s=60.0, rpc_timeout_s=10.0,
                      kill_actor=lambda handle: fake.killed.append(handle.actor))
    pool.reap_idle = lambda: None
    pool.remove_placement_groups = fake.groups_removed.append

    def create(req, shape, launch, busy=()):
        fake.created.append(req.trial_key)
        name = f"kubetune/ns/exp/#w-new-{len(fake.created)}"
        return Worker(name, fake.handle(name), shape, pool.pool_key(req, shape), namespace=f"{BASE}/ns/exp")

    pool.create = create
    named = NamedActors(lambda: [{"name": name, "namespace": f"{BASE}/ns/exp"} for name in fake.listed],
                        actor_group, max_age_s=0.0)
    discovery = ActorDiscovery(lock, held, pool, namespace=BASE, rpc_timeout_s=10.0, named=named)
    slots = TrialSlots(lock, held, pool, discovery, rpc_timeout_s=10.0)
    return fake, slots


def request(key: str = KEY) -> LaunchRequest:
    return LaunchRequest(trial_key=key, entrypoint="m:f", config={}, resources=TrialResources(cpu=0.05))


def answer(trial_key: str | None) -> dict:
    return {"trial_key": trial_key, "attempt": 0 if trial_key else None,
            "pool_key": "ns/exp/0123456789", "node_id": "n1", "shape": {"cpu": 0.05}}


def test_a_launch_waits_while_an_actor_of_its_experiment_has_not_answered(ray_parts):
    fake, slots = ray_parts
    with pytest.raises(LaunchDeferred) as deferred:
        slots.launch(request())
    assert fake.created == [], "a second actor was made while the first may host the trial"
    assert OLD_WORKER in str(deferred.value)
    # level-triggered: asked again, still silent, still deferred, still nothing made; and
    # the same words (the Trial's status message is not rewritten at each retry)
    with pytest.raises(LaunchDeferred) as again:
        slots.launch(request())
    assert fake.created == [] and fake.killed == []
    assert str(again.value) == str(deferred.value)


def test_once_the_silent_actor_answers_hosting_the_trial_the_launch_attaches_to_it(ray_parts):
    fake, slots = ray_parts
    with pytest.raises(LaunchDeferred):
        slots.launch(request())
    fake.answers[OLD_WORKER] = answer(KEY)
    info = slots.launch(request())
    assert info.attached and info.actor_name == OLD_WORKER
    assert fake.created == []


def test_once_the_silent_actor_answers_hosting_another_trial_the_launch_goes_ahead(ray_parts):
    fake, slots = ray_parts
    with pytest.raises(LaunchDeferred):
        slots.launch(request())
    fake.answers[OLD_WORKER] = answer("ns/exp/exp-1")
    info = slots.launch(request())
    assert not info.attached and fake.created == [KEY]
    assert slots.get("ns/exp/exp-1").worker.name == OLD_WORKER


def test_an_actor_silent_past_the_bound_is_killed_with_its_placement_groups_before_the_trial_is_launched(ray_parts):
    fake, slots = ray_parts
    with pytest.raises(LaunchDeferred):
        slots.launch(request())
    slots.silent_actor_bound_s = 0.0     # as if it had been silent that long
    info = slots.launch(request())
    assert fake.killed == [OLD_WORKER], "a silent actor was left running beside the new launch"
    assert fake.groups_removed == [OLD_WORKER], "its detached placement groups were left behind"
    assert not info.attached and fake.created == [KEY]
    # a trial it may have hosted is missing for that reason, not for a cluster restart
    other = slots._discovery.unknown_update("ns/exp/exp-1")
    assert other.state is TrialState.MISSING and other.cluster_fault
    assert other.error.startswith("SilentActorEnded:") and OLD_WORKER in other.error


def test_a_silent_dedicated_actor_holds_only_the_launch_of_its_own_trial(ray_parts):
    """A dedicated actor (GPU or several bundles) hosts only the trial it is named for."""
    fake, slots = ray_parts
    waiting_for_a_gpu = "kubetune/ns/exp/exp-2"
    fake.listed = [waiting_for_a_gpu]
    info = slots.launch(request())        # another trial: not held for it
    assert not info.attached and fake.created == [KEY] and fake.killed == []
    with pytest.raises(LaunchDeferred):   # its own trial: held until it answers
        slots.launch(request("ns/exp/exp-2"))
    assert fake.created == [KEY]
    assert slots._discovery.unknown_update("ns/exp/exp-2").state is TrialState.RUNNING


def test_a_deferred_launch_crosses_the_driver_wire_as_itself_only_for_a_start_and_bounded():
    error = LaunchDeferred("an actor of its Experiment has not answered")
    decoded = driver_wire.decode_error(driver_wire.encode_error(error), "10.0.0.2:10001", "start")
    assert type(decoded) is LaunchDeferred and "has not answered" in str(decoded)
    assert not isinstance(decoded, PlatformUnavailableError)
    other = driver_wire.decode_error(driver_wire.encode_error(ExecutorError("boom")), "10.0.0.2:10001", "start")
    assert type(other) is ExecutorError
    # a driver (a tenant's cluster may run code there) answering a stop with it: a plain error
    for method in ("stop", "pause", "poll"):
        sent = driver_wire.decode_error(driver_wire.encode_error(error), "10.0.0.2:10001", method)
        assert type(sent) is ExecutorError, method
    # a message up to the wire's 1 MiB becomes at most MESSAGE_CHARS of a Trial's status
    huge = {"error": "LaunchDeferred", "message": "x" * (1 << 20), "unavailable": False, "cause": ""}
    assert len(str(driver_wire.decode_error(huge, "10.0.0.2:10001", "start"))) <= LaunchDeferred.MESSAGE_CHARS


class DeferringPlatform:
    """A platform whose launches are deferred until ``defer`` is cleared."""

    def __init__(self) -> None:
        self.defer = True
        self.starts: list[str] = []
        self.unavailable: list[BaseException] = []

    def launch_waiting(self, request):
        return None

    def shown_waiting(self, reason, message, evictions, since_eviction):
        return reason, message

    def classify(self, error):
        return FailureKind.PLATFORM if isinstance(error, PlatformUnavailableError) else FailureKind.TRIAL

    def mark_unavailable(self, error) -> None:
        self.unavailable.append(error)

    async def list_trials(self, prefix):
        return []

    async def stop(self, trial_key):
        return None

    async def end_runs(self, prefix):
        return True

    async def start(self, request):
        self.starts.append(request.trial_key)
        if self.defer:
            raise LaunchDeferred(f"actor {OLD_WORKER} has not said yet which trial it hosts")
        return LaunchInfo(request.trial_key, "kubetune/ns/exp/#w-new-1", attached=False)


def one_trial_on_a_deferring_platform():
    """A controller whose runner decided to launch its one trial, on a platform that defers
    every launch (until the test says otherwise): the clock, the controller, its runner,
    the first decisions, the trial's name and the platform."""
    clock = [1.0]
    controller, runner, decisions = controller_with_runner(MemoryStore(), clock, maxTrials=1, parallelism=1)
    (name,) = [d.name for d in decisions if isinstance(d, LaunchTrial)]
    platform = controller.ctx.platform = DeferringPlatform()
    return clock, controller, runner, decisions, name, platform


def test_a_deferred_launch_stays_queued_and_is_tried_again_without_failing_the_trial_or_the_platform():
    clock, controller, runner, decisions, name, platform = one_trial_on_a_deferring_platform()

    async def scenario() -> None:
        await controller.effects.apply(decisions)
        assert platform.starts == [f"ns/exp/{name}"] and platform.unavailable == []
        assert name in controller.effects.pending(), "the deferred launch was dropped, not kept to retry"
        assert runner.trials[name].phase is TrialPhase.RUNNING and runner.trials[name].failure_log == []
        shown = controller.status.trial_status(name)
        assert (shown["phase"], shown["reason"]) == ("Queued", "LaunchDeferred") and OLD_WORKER in shown["message"]
        platform.defer = False
        for _ in range(20):                 # each retry after its backoff, on the controller's clock
            clock[0] += 60.0
            await controller.effects.apply([])
            if name not in controller.effects.pending():
                break
        assert platform.starts[-1] == f"ns/exp/{name}" and len(platform.starts) >= 2
        assert name not in controller.effects.pending() and platform.unavailable == []
        assert runner.trials[name].phase is TrialPhase.RUNNING and runner.trials[name].failure_log == []
        # its run starts when the launch went out: spec.trial.timeout does not count the wait
        assert runner.trials[name].attempt_start == clock[0]
        assert controller.status.trial_status(name)["phase"] == "Running"
    asyncio.run(scenario())


def test_a_deferred_launch_of_a_trial_ended_meanwhile_never_goes_out():
    clock, controller, runner, decisions, name, platform = one_trial_on_a_deferring_platform()

    async def scenario() -> None:
        await controller.effects.apply(decisions)
        assert len(platform.starts) == 1 and name in controller.effects.pending()
        runner.stop_all(clock[0])          # e.g. the Experiment was deleted or finished meanwhile
        platform.defer = False
        for _ in range(20):
            clock[0] += 60.0
            await controller.effects.apply([])
            if name not in {e.trial for e in controller.effects._effects if isinstance(e.decision, LaunchTrial)}:
                break
        assert len(platform.starts) == 1, "a launch went out for a trial that had ended"
    asyncio.run(scenario())


def test_a_worker_this_operator_made_never_holds_back_another_launch_while_it_starts(ray_parts):
    """A poll's discovery may ask a worker the executor has just made, before its slot is
    recorded: once recorded, it is known (it hosts what its slot says), so it must not
    defer the Experiment's other launches while it starts, nor be killed as silent."""
    fake, slots = ray_parts
    fake.listed = []                                  # nothing left by an earlier operator
    made = slots._pool.create

    def create_seen_by_a_poll(req, shape, launch, busy=()):
        worker = made(req, shape, launch, busy)
        fake.listed = [worker.name]                   # listed by Ray, still starting (no answer)
        slots._discovery.discover("ns/exp/", wait_s=0.0)
        return worker
    slots._pool.create = create_seen_by_a_poll
    first = slots.launch(request())
    assert not first.attached and fake.created == [KEY]
    other = slots.launch(request("ns/exp/exp-4"))     # was: LaunchDeferred, on our own worker
    assert not other.attached and fake.created == [KEY, "ns/exp/exp-4"]
    assert fake.killed == []


def test_a_launch_deferred_longer_than_the_trial_timeout_does_not_time_the_trial_out():
    """spec.trial.timeout counts a run, not the wait for a silent actor (up to 10 min),
    whatever the timeout (shorter than the 30 s the retries back off to, here), and the
    Trial is not rewritten for it at each retry; once the launch goes out, it counts."""
    from kubetune.controller.experiment import ExperimentController
    from unit_helpers import make_runner, make_spec
    store, clock = MemoryStore(), [1.0]
    spec = make_spec(budget={"maxTrials": 1, "parallelism": 1}, trial={"timeout": "10s"})
    body = {"metadata": {"name": "exp", "uid": "E"}, "spec": {}}
    controller = ExperimentController(namespace="ns", name="exp", store=store, registry=None,
                                      body=lambda: body, clock=lambda: clock[0])
    runner = make_runner(spec)
    controller.ctx.spec, controller.ctx.runner = spec, runner
    decisions = runner.step(clock[0])
    (name,) = [d.name for d in decisions if isinstance(d, LaunchTrial)]
    platform = controller.ctx.platform = DeferringPlatform()

    async def scenario() -> None:
        await controller.effects.apply(decisions)
        decided_start = runner.trials[name].attempt_start
        while clock[0] < 600.0:           # deferred for 10 min, retried on the controller's clock
            clock[0] += 20.0
            await controller.effects.apply(runner.step(clock[0]))
            assert runner.trials[name].phase is TrialPhase.RUNNING, runner.trials[name].failure_log
            assert runner.trials[name].attempt_start == decided_start     # nothing to rewrite
        assert len(platform.starts) > 2 and name in controller.effects.pending()
        platform.defer = False            # the launch goes out: the run, and its timeout, start now
        while name in controller.effects.pending():
            clock[0] += 20.0
            await controller.effects.apply(runner.step(clock[0]))
        launched_at = clock[0]
        assert runner.trials[name].attempt_start == launched_at and runner.trials[name].phase is TrialPhase.RUNNING
        clock[0] += 11.0
        await controller.effects.apply(runner.step(clock[0]))
        assert runner.trials[name].failure_log[-1]["reason"] == "TimedOut", runner.trials[name].failure_log
    asyncio.run(scenario())


def test_a_trial_restored_while_its_launch_was_deferred_counts_its_run_from_the_restore():
    """The deferral is not persisted as a flag (a restored trial's run may be re-adopted,
    with no launch to clear it): the Trial says Queued, LaunchDeferred, and its run's clock
    starts again at the restore instead of at the long-past decision."""
    from kubetune.controller import render
    from kubetune.core.types import StopTrial
    from unit_helpers import make_runner, make_spec
    spec = make_spec(budget={"maxTrials": 1}, trial={"timeout": "5m"})
    runner = make_runner(spec)
    runner.step(100.0)
    trial = runner.trials["exp-0"]
    runner.on_launch_deferred(trial.name)
    status = {**render.trial_status(trial), "phase": "Queued", "reason": "LaunchDeferred",
              "message": "waiting for actor kubetune-w-1 to say what it hosts", "launched": True}
    restarted = make_runner(spec)
    restarted.restore([render.trial_record({"metadata": {"name": trial.name},
                                            "spec": {"index": trial.index, "parameters": trial.params},
                                            "status": status})])
    assert [d for d in restarted.step(100.0 + 360.0) if isinstance(d, StopTrial)] == []   # 6 min after the decision
    assert [d.reason for d in restarted.step(100.0 + 360.0 + 300.0) if isinstance(d, StopTrial)] == ["TimedOut"]


def test_a_new_attempt_of_a_deferred_trial_is_timed_again():
    """Deferred, then retried (its cluster failed it): the new attempt is a new launch,
    timed from its own start, not left flagged as deferred."""
    from kubetune.core.types import StopTrial
    from unit_helpers import make_runner, make_spec
    runner = make_runner(make_spec(budget={"maxTrials": 1}, trial={"timeout": "1m", "maxFailures": 0}))
    runner.step(0.0)
    runner.on_launch_deferred("exp-0")
    runner.on_trial_errored("exp-0", "launch failed: ConnectionError", 10.0, cluster_fault=True)
    relaunched = [d for d in runner.step(20.0) if isinstance(d, LaunchTrial)]
    assert [d.attempt for d in relaunched] == [1]
    assert runner.trials["exp-0"].attempt_start == 20.0 and not runner.trials["exp-0"].launch_deferred
    assert [d.reason for d in runner.step(81.0) if isinstance(d, StopTrial)] == ["TimedOut"]
