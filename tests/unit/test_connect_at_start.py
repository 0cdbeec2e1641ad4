"""The operator connects to its own Ray cluster at start-up (handlers.connect_own_cluster,
issue 26): a burst of Experiments applied meanwhile waits for that one connection, and a
cluster that does not answer at start-up is tried again by the first Experiment that
needs it, no later than the platform's first backoff step."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from kubetune.executors.ray.platform import RayPlatforms
from kubetune.handlers import connect_own_cluster
from ray_fakes import FakeRayConnection
from waiting import until

OWN = "ray://head:10001"
DEADLINE = 60.0     # seconds: only ever reached when the code under test is wrong (unit_helpers.until's)


async def settle() -> None:
    """Let every task of the loop run up to the point where it waits (yields, not time)."""
    for _ in range(100):
        await asyncio.sleep(0)


class SlowRay(FakeRayConnection):
    """Connects once ``answer`` is set; fails while ``down``."""

    def __init__(self, down: bool = False) -> None:
        self.answer = threading.Event()
        self.down = down
        self.connects = 0

    def connect(self) -> None:
        self.connects += 1
        if not self.answer.wait(10):
            raise TimeoutError("the test never let the connection through")
        if self.down:
            raise ConnectionError("no route to head")

    def cluster_resources(self):
        return SimpleNamespace(total={"CPU": 2.0}, nodes=[])

    def node_types(self):
        return None

    def request_resources(self, bundles) -> None:
        pass


def test_a_burst_during_the_start_up_connection_waits_for_it_once():
    ray = SlowRay()
    made = []
    platforms = RayPlatforms(OWN, lambda address: made.append(address) or ray, allow_local=False)

    async def scenario() -> list[bool]:
        starting = asyncio.create_task(connect_own_cluster(platforms))
        await until(lambda: ray.connects, "the start-up connection under way")
        burst = [asyncio.create_task(platforms.get(OWN, f"ns-{i}").ensure_connected()) for i in range(20)]
        await settle()
        assert not platforms.get(OWN).connected      # what kubetune_ray_connected reads: not yet
        assert not any(task.done() for task in burst)     # they wait for it, none connects on its own
        ray.answer.set()
        await starting
        return await asyncio.gather(*burst)

    assert asyncio.run(scenario()) == [True] * 20
    assert made == [OWN] and ray.connects == 1


def test_a_cluster_down_at_start_up_is_tried_again_by_the_first_experiment_after_one_backoff_step():
    ray = SlowRay(down=True)
    ray.answer.set()
    now = [100.0]
    platforms = RayPlatforms(OWN, lambda address: ray, allow_local=False)

    async def scenario() -> tuple[bool, bool]:
        handle = platforms.get(OWN)
        handle._clock = lambda: now[0]
        await connect_own_cluster(platforms)
        assert not handle.connected and "no route to head" in handle.last_error
        ray.down = False            # the cluster comes up
        assert not await handle.ensure_connected()      # not tried again at once: backoff
        now[0] += 1.0               # the first backoff step
        return await handle.ensure_connected(), handle.connected

    assert asyncio.run(scenario()) == (True, True)
    assert ray.connects == 2


class SlowCapacity(SlowRay):
    """Connected at once; its capacity read waits for ``capacity`` to be set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer.set()
        self.capacity = threading.Event()
        self.reading = threading.Event()

    def cluster_resources(self):
        self.reading.set()
        if not self.capacity.wait(2 * DEADLINE):    # longer than the test's deadlines: a wait shows
            raise TimeoutError("the test never let the capacity read through")
        return super().cluster_resources()


def test_a_connected_cluster_holds_no_experiment_up_behind_a_capacity_refresh():
    ray = SlowCapacity()
    ray.capacity.set()
    platforms = RayPlatforms(OWN, lambda address: ray, allow_local=False)

    async def scenario() -> None:
        handle = platforms.get(OWN)
        assert await handle.ensure_connected()
        ray.capacity.clear()
        handle._capacity_at = float("-inf")        # due: the next cycle refreshes it
        refreshing = asyncio.create_task(handle.refresh_capacity())
        await until(ray.reading.is_set, "the capacity read under way")
        # meanwhile the other Experiments' cycles go on: connected, and nothing to wait for
        # (were it waiting for the refresh, the deadline would pass first)
        assert await asyncio.wait_for(handle.ensure_connected(), DEADLINE)
        ray.capacity.set()
        await refreshing
        ray.reading.clear()
        await asyncio.wait_for(handle.refresh_capacity(), DEADLINE)
        assert not ray.reading.is_set()       # fresh now: no second read

    asyncio.run(scenario())


def test_an_experiment_arriving_while_its_connection_is_retired_waits_and_connects_again():
    ray = SlowCapacity()
    ray.capacity.set()
    made = []
    platforms = RayPlatforms(OWN, lambda address: ray, allow_local=False,
                             separate_factory=lambda address, token_env="": made.append(address) or ray,
                             allow_unsandboxed=True)
    other = "ray://other:10001"

    async def scenario() -> None:
        handle = platforms.get(other)
        assert await handle.ensure_connected()
        handle._requested = [{"CPU": 1.0}]       # a request to withdraw: the retire awaits a Ray call
        ray.capacity.clear()
        withdrawing = threading.Event()
        ray.request_resources = lambda bundles: withdrawing.set() or ray.capacity.wait(10)
        retiring = asyncio.create_task(handle.retire(handle.uses))
        await until(withdrawing.is_set, "the retire withdrawing its request")
        using = asyncio.create_task(handle.ensure_connected())
        await settle()
        assert not using.done()          # not handed the connection being ended
        ray.capacity.set()
        assert await retiring
        assert await using and handle.connected and not handle.retired

    asyncio.run(scenario())
    assert made == [other, other]      # a new connection after the retired one


def test_a_cancelled_connect_leaves_nothing_that_passes_for_connected():
    ray = SlowRay()
    platforms = RayPlatforms(OWN, lambda address: ray, allow_local=False)

    async def scenario() -> None:
        handle = platforms.get(OWN)
        starting = asyncio.create_task(connect_own_cluster(platforms))
        await until(lambda: ray.connects, "the start-up connection under way")
        starting.cancel()             # the operator stops while it connects
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert not handle.connected and "cancelled" in handle.last_error
        ray.answer.set()              # the next use connects for real, at once
        assert await asyncio.wait_for(handle.ensure_connected(), DEADLINE) and handle.connected
        assert ray.connects == 2

    asyncio.run(scenario())
