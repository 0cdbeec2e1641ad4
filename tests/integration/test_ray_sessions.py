"""A pooled Ray worker never lets one trial's stray thread report into the next trial.

Trial A (examples/leaky.py) returns but leaves a thread reporting ``loss: 999`` every
10 ms.  Trial B runs next on the same experiment and shape, so on the same pooled
worker if it is reused.  Before the fix a stray ``threading.Thread`` reached B's
session (the worker handed every thread the process's only running trial) and B's
history held ``999``s.  Now:

- a ``threading.Thread`` inherits A's session: its reports are dropped, and the
  worker, which still runs A's thread, is retired instead of pooled;
- a thread the trial cannot know it started (``_thread.start_new_thread``, as a
  native library's) has no session at all: the worker is reused, and B still sees
  none of its reports.
"""
from __future__ import annotations

import uuid

import pytest
import ray

from kubetune.executors.ray.executor import RayExecutor
from kubetune.executors.ray.pool import namespace_of_actor
from kube_fixtures import wait_for
from test_ray_executor import SLEEPY, Tracker, launch

pytestmark = pytest.mark.integration

LEAKY = "kubetune.examples.leaky:train"


def _lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _alive(actor: str) -> bool:
    try:
        ray.get_actor(actor, namespace=namespace_of_actor("kubetune", actor))
        return True
    except ValueError:
        return False


@pytest.fixture
def experiment(ray_local):
    prefix = f"it/s{uuid.uuid4().hex[:8]}/"
    yield prefix
    RayExecutor(ray_local).stop_all(prefix)


@pytest.mark.parametrize("how", ["thread", "native"])
def test_a_stray_thread_of_an_ended_trial_never_reports_into_the_next(ray_local, experiment, tmp_path, how):
    executor = RayExecutor(ray_local)      # pooled workers (reuse_actors) by default
    tracker = Tracker(executor)
    trace, release, gate = tmp_path / "trace", tmp_path / "release", tmp_path / "gate"
    first = f"{experiment}leaky-a"
    a = executor.start(launch(first, LEAKY, {"how": how, "trace": str(trace), "release": str(release)}))
    assert tracker.until_done(first).state.value == "completed"
    assert [r.metrics["loss"] for r in tracker.history[first]] == [1.0]
    wait_for(lambda: _lines(trace) >= 3, timeout=60, message="the stray thread reporting")
    executor.stop(first)

    second = f"{experiment}sleepy-b"
    b = executor.start(launch(second, SLEEPY, {"interval": 0, "iterations": 3, "hold_after": 1,
                                               "gate": str(gate)}))
    tracker.until(second, lambda u: tracker.cursor.get(second, 0) >= 1)
    # B holds after its first report while the stray thread tries to report into it, until
    # the stray is seen trying 20 more times (or its process is gone: a retired worker)
    tried = _lines(trace)
    wait_for(lambda: _lines(trace) >= tried + 20 or not _alive(a.actor_name),
             timeout=60, message="the stray thread reporting while trial B runs")
    gate.touch()
    final = tracker.until_done(second)
    release.touch()

    assert final.state.value == "completed"
    assert [r.metrics.get("step") for r in tracker.history[second]] == [1, 2, 3]
    assert all("loss" not in r.metrics for r in tracker.history[second]), \
        [r.metrics for r in tracker.history[second]]
    if how == "thread":   # A's thread still ran when A ended: its worker was retired
        assert b.actor_name != a.actor_name
        wait_for(lambda: not _alive(a.actor_name), timeout=60, message="the retired worker ending")
    else:                 # unknown to A's session: the worker was reused, and B was safe anyway
        assert b.actor_name == a.actor_name
