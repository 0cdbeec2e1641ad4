"""The Ray executor's lock (one RLock shared by its slots, pool and discovery) is never
held across a Ray call: a call stuck in a head outage (executors/ray/outage.py gives up
waiting for it, but cannot take a lock back from its thread) would otherwise hold every
other call on that executor.

Real threads; the "Ray call" is a kill function blocked on an event, injected into the
pool, so a kill is in flight for as long as the test wants.  And a rule read from the
source: no Ray call inside a ``with self._lock:`` block of executors/ray/, checked against
a planted violation."""
from __future__ import annotations

import ast
import pathlib
import threading
import time

import pytest

import kubetune
from kubetune.executors.ray.discovery import ActorDiscovery
from kubetune.executors.ray.pool import Worker, WorkerPool
from kubetune.executors.ray.slots import Slot
from kubetune.spec.model import TrialResources

DEADLINE_S = 30.0     # a deadline for a condition, never a measured duration


class HangingKill:
    """``ray.kill`` as it behaves in a head outage: it does not return until released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.killed: list[str] = []

    def __call__(self, handle: str) -> None:
        self.killed.append(handle)
        self.started.set()
        assert self.release.wait(DEADLINE_S), "the test never released the kill"


def pool_with(kill: HangingKill, lock: threading.RLock, *idle: Worker) -> WorkerPool:
    pool = WorkerPool(lock, address="10.0.0.1:6379", namespace="kubetune", reuse_actors=True,
                      idle_ttl_s=1.0, orphan_timeout_s=60.0, rpc_timeout_s=1.0, kill_actor=kill)
    for worker in idle:
        pool._idle.setdefault(worker.pool_key, []).append(worker)
    return pool


def worker(name: str, pool_key: str, idle_for_s: float) -> Worker:
    return Worker(f"kubetune/ns/exp/#w-{name}", handle=name, shape=TrialResources(cpu=1.0), pool_key=pool_key,
                  idle_since=time.monotonic() - idle_for_s, namespace="kubetune/ns/exp")


def while_in_flight(kill: HangingKill, lock: threading.RLock, action) -> None:
    """Run ``action`` in a thread until its kill is in flight, then show that another thread
    takes the lock meanwhile; release the kill and let ``action`` end."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    try:
        assert kill.started.wait(DEADLINE_S), "the action never killed an actor"
        taken = threading.Event()

        def other_call() -> None:     # as poll/stop/discovery take the lock on their threads
            with lock:
                taken.set()

        threading.Thread(target=other_call, daemon=True).start()
        assert taken.wait(DEADLINE_S), "the lock stayed held while a Ray kill was in flight"
    finally:
        kill.release.set()
        thread.join(DEADLINE_S)
    assert not thread.is_alive()


def test_reaping_an_expired_worker_holds_no_lock_while_its_kill_is_in_flight():
    kill, lock = HangingKill(), threading.RLock()
    expired, fresh = worker("old", "ns/exp/a", idle_for_s=60.0), worker("new", "ns/exp/a", idle_for_s=0.0)
    pool = pool_with(kill, lock, expired, fresh)
    seen_during_kill: list[list[str]] = []

    def reap() -> None:
        pool.reap_idle()

    thread = threading.Thread(target=reap, daemon=True)
    thread.start()
    assert kill.started.wait(DEADLINE_S)
    # taken out of the pool before it is killed: no other thread hands it a trial meanwhile
    seen_during_kill.append([w.name for w in pool.idle_workers()])
    kill.release.set()
    thread.join(DEADLINE_S)
    assert seen_during_kill == [[fresh.name]]
    assert kill.killed == ["old"]
    assert [w.name for w in pool.idle_workers()] == [fresh.name]


@pytest.mark.parametrize("entry", ["reap_idle", "take_idle"])
def test_other_locked_calls_go_on_while_an_idle_worker_is_killed(entry):
    kill, lock = HangingKill(), threading.RLock()
    pool = pool_with(kill, lock, worker("old", "ns/exp/a", idle_for_s=60.0))
    action = pool.reap_idle if entry == "reap_idle" else (lambda: pool.take_idle("ns/exp/b"))
    while_in_flight(kill, lock, action)
    assert kill.killed == ["old"]


@pytest.mark.parametrize("claim", ["a trial another actor hosts", "nothing (a leftover dedicated actor)"])
def test_discovery_ends_an_actor_it_does_not_adopt_outside_the_lock(claim):
    kill, lock = HangingKill(), threading.RLock()
    pool = pool_with(kill, lock)
    slots = {"ns/exp/exp-0": Slot(worker("current", "ns/exp/a", 0.0), attempt=0)}
    discovery = ActorDiscovery(lock, slots, pool, namespace="kubetune", rpc_timeout_s=1.0)
    if claim.startswith("a trial"):
        name, answer = "kubetune/ns/exp/#w-late", {"trial_key": "ns/exp/exp-0", "attempt": 0}
        late = Worker(name, handle="late", shape=TrialResources(cpu=1.0), pool_key="ns/exp/a")
    else:
        name, answer = "kubetune/ns/exp/exp-1", {"trial_key": None, "attempt": None, "stray_threads": []}
        late = Worker(name, handle="late", shape=TrialResources(cpu=1.0), pool_key="")
    while_in_flight(kill, lock, lambda: discovery._adopt(name, late, answer))
    assert kill.killed == ["late"]
    assert slots["ns/exp/exp-0"].worker.name == "kubetune/ns/exp/#w-current"


# ---------------------------------------------------------------- the rule, read from the source

RAY_DIR = pathlib.Path(kubetune.__file__).parent / "executors" / "ray"
LOCKED_MODULES = ("executor.py", "slots.py", "pool.py", "discovery.py")
# methods of ours that make Ray calls (an actor call, a kill, a resource query)
RAY_CALLING = {"kill", "reap_idle", "take_idle", "give_back", "create", "remove_placement_groups", "_free_name",
               "_evict_idle_for", "call", "ready", "read", "discover", "discover_once", "find_unknown",
               "actor_names", "end", "launch", "_stop", "_fetch", "settle_acks"}
# connecting is what the lock serializes (one ray.init per process): nothing else can run
# on a connection being made or dropped anyway
CONNECTION_LIFECYCLE = {"connect", "disconnect"}


def ray_calls_under_the_lock(source: str) -> list[str]:
    """``function: call`` for each Ray call inside a ``with self._lock:`` block."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                or function.name in CONNECTION_LIFECYCLE:
            continue
        for block in ast.walk(function):
            if not (isinstance(block, ast.With)
                    and any(ast.unparse(item.context_expr) == "self._lock" for item in block.items)):
                continue
            for node in (n for statement in block.body for n in ast.walk(statement)):
                if not isinstance(node, ast.Call):
                    continue
                name = ast.unparse(node.func)
                if name.startswith("ray.") or name.split(".")[-1] in RAY_CALLING:
                    found.append(f"{function.name}: {name}")
    return found


def test_no_ray_call_is_made_holding_the_executors_lock():
    found = {module: ray_calls_under_the_lock((RAY_DIR / module).read_text()) for module in LOCKED_MODULES}
    assert {module: calls for module, calls in found.items() if calls} == {}


def test_the_lock_rule_sees_a_planted_violation():
    planted = (
        "class Pool:\n"
        "    def reap_idle(self):\n"
        "        with self._lock:\n"
        "            for worker in self._idle:\n"
        "                self.kill(worker)\n"
        "                ray.util.remove_placement_group(worker.group)\n"
        "        self.kill(None)\n"      # outside the lock: allowed
        "    def connect(self):\n"
        "        with self._lock:\n"
        "            ray.init()\n")
    assert ray_calls_under_the_lock(planted) == ["reap_idle: self.kill", "reap_idle: ray.util.remove_placement_group"]
