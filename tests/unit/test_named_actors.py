"""One listing of the cluster's named actors serves every Experiment for a moment
(executors/ray/named_actors.py): one fetch however many ask at once, a new one once it
is older than ``max_age_s``, and an actor this executor ended is never shown alive by a
listing fetched before the kill.  Real threads; the listing's source is a function
that blocks on an event where a test needs a fetch to be under way."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubetune.executors.ray.discovery import actor_group
from kubetune.executors.ray.named_actors import NamedActors
from unit_helpers import wait_for


def actor(name: str) -> dict:
    return {"namespace": "kubetune/" + "/".join(name.split("/")[1:3]), "name": name}


class Cluster:
    """The named actors of a pretend cluster; ``hold()`` makes the next fetches wait until ``release()``."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.calls = 0
        self.entered = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self.fail_next = False

    def hold(self) -> None:
        self._go.clear()
        self.entered.clear()

    def release(self) -> None:
        self._go.set()

    def fetch(self) -> list[dict]:
        self.calls += 1
        snapshot = [actor(n) for n in self.names]     # what Ray said as the call went out
        self.entered.set()
        assert self._go.wait(30), "never released"
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("GCS went away")
        return snapshot


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def names(pairs) -> list[str]:
    return sorted(name for _, name in pairs)


A1, A2, B1 = "kubetune/ns/a/#w-1", "kubetune/ns/a/t-2", "kubetune/ns/b/t-1"


def make(cluster: Cluster, clock: Clock, max_age_s: float = 1.0) -> NamedActors:
    return NamedActors(cluster.fetch, actor_group, max_age_s=max_age_s, clock=clock)


def test_everyone_asking_while_one_fetch_is_under_way_gets_that_fetch():
    cluster, clock = Cluster(A1, A2, B1), Clock()
    named = make(cluster, clock)
    cluster.hold()
    askers = 8
    with ThreadPoolExecutor(askers) as pool:
        first = pool.submit(named.actors)
        assert cluster.entered.wait(30)
        rest = [pool.submit(named.actors, "ns/a/") for _ in range(askers - 1)]
        wait_for(lambda: named.waiting == askers - 1, timeout=30.0)    # all queued behind the one fetch
        cluster.release()
        assert names(first.result(30)) == [A1, A2, B1]
        assert all(names(f.result(30)) == [A1, A2] for f in rest)
    assert cluster.calls == named.fetches == 1


def test_a_listing_is_shared_until_it_is_older_than_max_age():
    cluster, clock = Cluster(A1), Clock()
    named = make(cluster, clock, max_age_s=1.0)
    assert names(named.actors()) == [A1]
    cluster.names.append(B1)
    clock.now += 1.0
    assert names(named.actors()) == [A1]          # still the first listing
    assert cluster.calls == 1
    clock.now += 0.01
    assert names(named.actors()) == [A1, B1]      # older than max_age: fetched again
    assert cluster.calls == 2
    assert named.groups() == ["ns/a/", "ns/b/"]
    assert names(named.actors("ns/b/")) == [B1]
    assert named.actors("ns/zz/") == []


def test_an_actor_ended_after_the_listing_was_fetched_is_left_out():
    cluster, clock = Cluster(A1, A2, B1), Clock()
    named = make(cluster, clock)
    assert names(named.actors("ns/a/")) == [A1, A2]
    named.killed(A2)
    assert names(named.actors("ns/a/")) == [A1]   # no new fetch needed to leave it out
    assert names(named.actors()) == [A1, B1]
    assert cluster.calls == 1


def test_an_actor_ended_while_the_listing_is_fetched_is_left_out():
    cluster, clock = Cluster(A1, A2), Clock()
    named = make(cluster, clock)
    cluster.hold()
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(named.actors, "ns/a/")
        assert cluster.entered.wait(30)       # Ray answers with A2 still alive...
        named.killed(A2)                      # ...which the executor ends meanwhile
        cluster.release()
        assert names(asked.result(30)) == [A1]


def test_after_a_fetch_that_began_after_the_kill_ray_has_the_word():
    # A dedicated actor's name comes back with the trial's next attempt: a listing asked
    # after the kill shows it again.
    cluster, clock = Cluster(A1, A2), Clock()
    named = make(cluster, clock)
    named.actors()
    named.killed(A2)
    clock.now += 2
    assert names(named.actors()) == [A1, A2]
    assert cluster.calls == 2


def test_fresh_asks_ray_now_and_leaves_nothing_out():
    cluster, clock = Cluster(A1), Clock()
    named = make(cluster, clock)
    named.actors()
    cluster.names.append(A2)
    named.killed(A1)        # Ray ends actors asynchronously: a fresh listing says what Ray says
    assert names(named.actors("ns/a/", fresh=True)) == [A1, A2]
    assert cluster.calls == 2
    assert names(named.actors()) == [A1, A2]      # and is shared from then on
    assert cluster.calls == 2


def test_when_the_fetch_fails_its_caller_sees_the_error_and_a_waiter_fetches_again():
    cluster, clock = Cluster(A1), Clock()
    named = make(cluster, clock)
    cluster.hold()
    cluster.fail_next = True
    with ThreadPoolExecutor(2) as pool:
        failing = pool.submit(named.actors)
        assert cluster.entered.wait(30)
        waiter = pool.submit(named.actors)
        wait_for(lambda: named.waiting == 1, timeout=30.0)
        cluster.release()
        with pytest.raises(ConnectionError):
            failing.result(30)
        assert names(waiter.result(30)) == [A1]   # not left waiting for a listing that never came
    assert cluster.calls == 2 and named.fetches == 1


def test_names_outside_our_prefix_belong_to_no_experiment():
    assert actor_group("kubetune/ns/exp/#w-abc-1") == "ns/exp/"
    assert actor_group("kubetune/ns/exp") is None
    assert actor_group("other/ns/exp/x") is None
