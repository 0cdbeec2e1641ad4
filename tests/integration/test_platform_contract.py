"""One contract, every platform (as Optuna runs one suite against every storage): what
the controller relies on from a ``Platform`` (executors/platform.py), checked against
the Ray platform (a real local Ray head), the pod platform (a real API server with
the kube-scheduler and kwok's fake nodes; the test plays each trial's container, as
test_pods.py does) and the local platform (real processes of this host).

The contract: a launched trial's results arrive once each, in sequence, and its end is
told; a stopped run is gone; a paused run hands over its latest checkpoint and a
relaunch from it continues the history (iterations and sequence numbers); a failed
attempt is retried from its checkpoint; the platform tells a trial's failure from its
own (``classify``) and reports a run that vanished as MISSING.

A harness per platform makes a trial do what a test needs (``play``): on Ray the
trial's function does it itself (kubetune.examples.resumable), and so it does as a
local process; on pods the test posts the results and ends the pod."""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

import pytest

from kube_fixtures import temporary_namespace, wait_for
from kubetune.core.failures import FailureKind
from kubetune.core.types import Result
from kubetune.executors.base import LaunchRequest, TrialState, TrialUpdate
from kubetune.executors.platform import Platform
from kubetune.spec.model import TrialResources

pytestmark = pytest.mark.integration

RESUMABLE = "kubetune.examples.resumable:train"
SMALL = TrialResources(cpu=0.5)
DEADLINE_S = 90.0       # a loaded 2-core machine: conditions, never timings, decide


class RayHarness:
    """Trials as Ray actors; the function (resumable) plays the script itself."""

    name = "ray"

    def __init__(self, address: str, storage: Path) -> None:
        self.address, self.storage = address, storage
        self.namespace = "contract"

    async def open(self) -> Platform:
        from kubetune.executors.ray.executor import RayExecutor
        from kubetune.executors.ray.platform import RayPlatform
        self.executor = RayExecutor(self.address, reuse_actors=False)   # a run is one actor: losing it loses the run
        platform = RayPlatform(self.address, lambda address: self.executor)
        assert await platform.ensure_connected(), platform.last_error
        return platform

    async def close(self, platform: Platform, prefix: str) -> None:
        await platform.end_all(prefix)
        await asyncio.to_thread(self.executor.disconnect)

    def request(self, key: str, *, steps: int, then: str, attempt: int = 0, checkpoint: str | None = None,
                start_iteration: int = 0, start_seq: int = 0) -> LaunchRequest:
        config: dict[str, Any] = {"lr": 0.2, "interval": 0.01, "iterations": start_iteration + steps}
        if then == "fail":
            config.update(fail_at=start_iteration + steps, fail_attempts="all")
        elif then == "hold":   # after its steps it waits for a gate nobody opens: until stopped or paused
            config.update(iterations=start_iteration + steps + 100, hold_at=start_iteration + steps,
                          gate=str(self.storage / f"never-{uuid.uuid4().hex}"))
        return LaunchRequest(trial_key=key, entrypoint=RESUMABLE, config=config, resources=SMALL,
                             checkpoint=checkpoint, start_iteration=start_iteration, start_seq=start_seq,
                             attempt=attempt, storage=str(self.storage), metric="loss", mode="min")

    def play(self, key: str, *, steps: int, then: str, attempt: int = 0) -> Callable[[], None]:
        return lambda: None

    def lose(self, key: str, history: list[Result]) -> None:
        """The run's process dies (a node lost, an OOM kill)."""
        import signal
        os.kill(int(history[-1].metrics["pid"]), signal.SIGKILL)


class LocalHarness(RayHarness):
    """Trials as processes of this host (executors/local); the function plays the script,
    and a lost run is its process killed from outside."""

    name = "local"

    def __init__(self, storage: Path) -> None:
        self.storage, self.namespace = storage, "contract"

    async def open(self) -> Platform:
        from kubetune.executors.local.platform import LocalPlatform
        platform = LocalPlatform()
        assert await platform.ensure_connected(), platform.last_error
        return platform

    async def close(self, platform: Platform, prefix: str) -> None:
        await platform.end_all(prefix)


class PodHarness:
    """Trials as pods on kwok's fake nodes; the test plays the container."""

    name = "pod"

    def __init__(self, cluster, namespace: str, storage: Path) -> None:
        self.cluster, self.namespace, self.storage = cluster, namespace, storage
        self.workdir = Path(tempfile.mkdtemp(prefix="kt-contract-"))
        self.experiments: set[str] = set()

    async def open(self) -> Platform:
        from kubernetes import client
        from kubetune.devcluster.processes import free_port
        from kubetune.executors.pods.cluster import PodPlatform
        from kubetune.executors.pods.executor import PodExecutor
        from kubetune.executors.pods.ingest import IngestServer, ResultInbox
        self.api = self.cluster.api_client()
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        inbox = ResultInbox()
        self.server = IngestServer(inbox, host="127.0.0.1", port=free_port())
        await self.server.start()
        executor = PodExecutor(inbox, f"http://127.0.0.1:{self.server.port}", api_client=self.api, list_interval_s=0.2)
        platform = PodPlatform(executor)
        assert await platform.ensure_connected(), platform.last_error
        return platform

    async def close(self, platform: Platform, prefix: str) -> None:
        await asyncio.to_thread(platform.executor.stop_all, prefix)
        await self.server.stop()
        self.api.close()

    def _trial_resource(self, key: str) -> None:
        """The Trial resource a pod is owned by (the controller creates it before a launch)."""
        from k8s_helpers import GROUP, VERSION
        from kubetune.controller.render import trial_body
        from test_pods import pod_experiment
        namespace, experiment, trial = key.split("/")
        if experiment not in self.experiments:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "experiments",
                                                       {**pod_experiment(experiment), "metadata": {"name": experiment}})
            self.experiments.add(experiment)
        owner = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", experiment)
        body = trial_body(namespace=namespace, experiment=owner, name=trial, index=0, params={"lr": 0.2},
                          resources={"cpu": 0.5})
        try:
            self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "trials", body)
        except Exception as error:  # noqa: BLE001 - a relaunch: the Trial exists
            if getattr(error, "status", None) != 409:
                raise

    def request(self, key: str, *, steps: int, then: str, attempt: int = 0, checkpoint: str | None = None,
                start_iteration: int = 0, start_seq: int = 0) -> LaunchRequest:
        from test_pods import pod_experiment
        self._trial_resource(key)
        template = pod_experiment("x")["spec"]["trial"]["template"]
        return LaunchRequest(trial_key=key, entrypoint="", config={"lr": 0.2}, resources=SMALL,
                             checkpoint=checkpoint, start_iteration=start_iteration, start_seq=start_seq,
                             attempt=attempt, storage=str(self.storage), metric="loss", mode="min",
                             pod_template=template)

    def _pod(self, key: str, attempt: int):
        from kubetune.executors.pods import spec as pod_spec
        namespace, _, trial = key.split("/")
        name = pod_spec.pod_name(trial, attempt)
        pods = self.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    def play(self, key: str, *, steps: int, then: str, attempt: int = 0) -> Callable[[], None]:
        """The container's part, run in a thread while the test polls: report ``steps``
        iterations with a checkpoint each, then exit 0 (complete), 1 (fail) or nothing (hold)."""
        from test_pods import Container

        def container() -> None:
            pod = wait_for(lambda: self._pod(key, attempt), timeout=DEADLINE_S, interval=0.2,
                           message=f"the pod of {key} attempt {attempt}")
            played = Container(self.core, pod, self.workdir)
            state, start = 0.0, int(played.env.get("KUBETUNE_START_ITERATION") or 0)
            restored = played.session.get_checkpoint()
            if restored is not None:
                state = json.loads((Path(restored) / "state.json").read_text())["i"]
            assert state == start, f"resumed at {start} from a checkpoint of iteration {state}"
            for i in range(start + 1, start + steps + 1):
                saved = self.workdir / f"{played.name}-{i}"
                saved.mkdir()
                (saved / "state.json").write_text(json.dumps({"i": i}))
                played.session.report({"loss": 1.0 / i}, checkpoint=str(saved))
            if then == "complete":
                played.exit(0)
            elif then == "fail":
                played.exit(1, "Error")
        return container

    def lose(self, key: str, history: list[Result]) -> None:
        """The pod is deleted under the trial (a node drained, an eviction)."""
        from kubetune.executors.pods import spec as pod_spec
        namespace, _, trial = key.split("/")
        self.core.delete_namespaced_pod(pod_spec.pod_name(trial, 0), namespace, grace_period_seconds=0)


@pytest.fixture(scope="module")
def checkpoint_storage(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("contract-checkpoints")


@pytest.fixture(scope="module", params=["ray", "pod", "local"])
def harness(request, checkpoint_storage):
    if request.param == "local":
        yield LocalHarness(checkpoint_storage)
        return
    if request.param == "ray":
        yield RayHarness(request.getfixturevalue("ray_local"), checkpoint_storage)
        return
    cluster = request.getfixturevalue("gpu_cluster")
    with temporary_namespace(cluster, "kt-contract-") as namespace:
        yield PodHarness(cluster, namespace, checkpoint_storage)


def run(harness, scenario: Callable[[Platform, str], Awaitable[None]]) -> None:
    """``scenario(platform, prefix)`` on a fresh platform, its runs ended afterwards."""
    prefix = f"{harness.namespace}/c{uuid.uuid4().hex[:8]}/"

    async def main() -> None:
        platform = await harness.open()
        try:
            await scenario(platform, prefix)
        finally:
            await harness.close(platform, prefix)
    asyncio.run(main())


async def collect(platform: Platform, key: str, until: Callable[[TrialUpdate, list[Result]], bool],
                  history: list[Result] | None = None, after: int = 0) -> tuple[list[Result], TrialUpdate]:
    """Poll as the controller does (results after the last seq seen) until ``until``;
    every result arrives once, in sequence."""
    history = [] if history is None else history
    cursor = history[-1].seq if history else after
    deadline = time.monotonic() + DEADLINE_S
    while True:
        update = (await platform.poll({key: cursor}, wait_s=0.05))[key]
        assert [r.seq for r in update.results] == list(range(cursor + 1, cursor + 1 + len(update.results)))
        history.extend(update.results)
        cursor = history[-1].seq if history else cursor
        if until(update, history):
            return history, update
        assert time.monotonic() < deadline, f"{key}: gave up at {update}"
        await asyncio.sleep(0.05)


async def launched(harness, platform: Platform, key: str, *, steps: int, then: str, **request: Any) -> asyncio.Task:
    """Launch, and start the harness's part of the run (nothing on Ray)."""
    await platform.start(harness.request(key, steps=steps, then=then, **request))
    return asyncio.create_task(asyncio.to_thread(harness.play(key, steps=steps, then=then,
                                                              attempt=request.get("attempt", 0))))


def checkpointed(history: list[Result]) -> Result:
    return next(r for r in reversed(history) if r.checkpoint)


def test_a_launched_trial_reports_every_result_once_in_order_and_completes(harness):
    async def scenario(platform: Platform, prefix: str) -> None:
        key = f"{prefix}done"
        player = await launched(harness, platform, key, steps=3, then="complete")
        history, final = await collect(platform, key, lambda u, h: u.state.is_terminal)
        await player
        assert final.state is TrialState.COMPLETED, final
        assert [r.iteration for r in history] == [1, 2, 3]
        assert [r.seq for r in history] == [1, 2, 3]
        assert all(r.checkpoint for r in history) and all(r.metrics["loss"] > 0 for r in history)
    run(harness, scenario)


def test_a_stopped_trial_is_gone(harness):
    async def scenario(platform: Platform, prefix: str) -> None:
        key = f"{prefix}stopped"
        await launched(harness, platform, key, steps=1, then="hold")
        await collect(platform, key, lambda u, h: bool(h))
        assert key in await platform.list_trials(prefix)
        await platform.stop(key)
        deadline = time.monotonic() + DEADLINE_S
        while key in await platform.list_trials(prefix):
            assert time.monotonic() < deadline, f"{key} still runs after its stop"
            await asyncio.sleep(0.1)
    run(harness, scenario)


def test_a_paused_trial_resumes_from_its_checkpoint(harness):
    async def scenario(platform: Platform, prefix: str) -> None:
        key = f"{prefix}paused"
        await launched(harness, platform, key, steps=2, then="hold")
        history, _ = await collect(platform, key, lambda u, h: len(h) >= 2)
        paused = await platform.pause(key, after_seq=history[-1].seq)
        history += [r for r in (paused.results if paused else ()) if r.seq > history[-1].seq]
        resume_from = checkpointed(history)
        history = [r for r in history if r.seq <= resume_from.seq]    # what a resumed run continues
        player = await launched(harness, platform, key, steps=2, then="complete", attempt=1,
                                checkpoint=resume_from.checkpoint, start_iteration=resume_from.iteration,
                                start_seq=resume_from.seq)
        history, final = await collect(platform, key, lambda u, h: u.state.is_terminal, history=history)
        await player
        assert final.state is TrialState.COMPLETED, final
        resumed = [r for r in history if r.seq > resume_from.seq]
        assert [r.iteration for r in resumed] == [resume_from.iteration + 1, resume_from.iteration + 2]
        assert [r.seq for r in resumed] == [resume_from.seq + 1, resume_from.seq + 2]
        assert {r.attempt for r in resumed} == {1}
    run(harness, scenario)


def test_a_failed_attempt_is_retried_from_its_checkpoint(harness):
    async def scenario(platform: Platform, prefix: str) -> None:
        key = f"{prefix}failed"
        player = await launched(harness, platform, key, steps=2, then="fail")
        history, failed = await collect(platform, key, lambda u, h: u.state.is_terminal)
        await player
        assert failed.state is TrialState.FAILED and failed.error, failed
        last = checkpointed(history)
        assert last.iteration == 2
        player = await launched(harness, platform, key, steps=1, then="complete", attempt=1,
                                checkpoint=last.checkpoint, start_iteration=last.iteration, start_seq=last.seq)
        history, final = await collect(platform, key, lambda u, h: u.state.is_terminal, history=history)
        await player
        assert final.state is TrialState.COMPLETED, final
        assert [(r.iteration, r.attempt) for r in history[2:]] == [(3, 1)]
    run(harness, scenario)


def test_the_platform_tells_its_faults_from_the_trials(harness):
    async def scenario(platform: Platform, prefix: str) -> None:
        assert platform.classify(ConnectionError("connection refused")) is FailureKind.PLATFORM
        assert platform.classify(ValueError("the trial's own mistake")) is FailureKind.TRIAL
        key = f"{prefix}lost"
        await launched(harness, platform, key, steps=1, then="hold")
        history, _ = await collect(platform, key, lambda u, h: bool(h))
        await asyncio.to_thread(harness.lose, key, history)
        _, lost = await collect(platform, key, lambda u, h: u.state.is_terminal, history=history)
        assert lost.state is TrialState.MISSING and lost.error, lost
    run(harness, scenario)
