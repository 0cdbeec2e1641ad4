"""A trial's process is the tenant's (issue 25, N1): nothing it answers is unpickled by
the operator, and an actor claiming a trial the operator did not give it gets nothing.

The executor runs in this test process, as it runs in the operator's: a marker written
by this process means code of the trial ran in the operator."""
from __future__ import annotations

import os
import uuid

import pytest

from kubetune.executors.base import TrialState
from kubetune.executors.ray.executor import RayExecutor

from kube_fixtures import wait_for
from test_ray_executor import SLEEPY, Tracker, launch

pytestmark = pytest.mark.integration

PLANTS = "kubetune.examples.hostile:plants_pickle"
CLAIMS = "kubetune.examples.hostile:claims"


def _cleanup(ray_local, *prefixes):
    executor = RayExecutor(ray_local)
    for prefix in prefixes:
        executor.stop_all(prefix)


@pytest.mark.parametrize("how", ["answer", "return"])
def test_a_planted_pickle_never_runs_in_the_operator_and_fails_its_trial(ray_local, tmp_path, how):
    prefix = f"it/u{uuid.uuid4().hex[:8]}/"
    marker = tmp_path / "unpickled"
    executor = RayExecutor(ray_local)
    key = f"{prefix}evil-0"
    try:
        executor.start(launch(key, PLANTS, {"marker": str(marker), "how": how, "interval": 0.02}))
        tracker = Tracker(executor)

        def ended_or_unpickled():
            if marker.exists() and str(os.getpid()) in marker.read_text().split():
                return "unpickled"
            try:
                update = tracker.poll(key)[key]
            except Exception as exc:  # noqa: BLE001 - what the operator would make of it
                return f"poll raised {type(exc).__name__}: {exc}"
            return update if update.state.is_terminal else None
        final = wait_for(ended_or_unpickled, timeout=90, message="the trial to end")
        assert final != "unpickled", "the trial's pickle was unpickled in the operator's process"
        assert not isinstance(final, str), final
        assert final.state is TrialState.FAILED, final
        assert final.error.startswith("TrialRejected") and ("not read" in final.error or "not JSON" in final.error), \
            final.error
    finally:
        _cleanup(ray_local, prefix)
    assert not marker.exists(), marker.read_text()


def test_an_actor_claiming_another_experiments_trial_is_not_adopted(ray_local):
    """After a restart the executor asks actors what they host: an actor of experiment X
    that claims a trial of experiment Y is not taken for Y's trial (nor for any)."""
    x, y = f"it/c{uuid.uuid4().hex[:8]}/", f"it/v{uuid.uuid4().hex[:8]}/"
    victim = f"{y}victim-0"
    first = RayExecutor(ray_local)
    try:
        liar = f"{x}liar-0"
        first.start(launch(liar, CLAIMS, {"claim": victim, "interval": 0.02}))
        Tracker(first).until(liar, lambda u: u.results)
        restarted = RayExecutor(ray_local)     # a new operator: knows no actor yet
        tracker = Tracker(restarted)
        tracker.poll(liar)                      # discovers experiment X's actors
        update = wait_for(lambda: ((u := tracker.poll(victim)[victim]).state is not TrialState.RUNNING
                                   or tracker.history.get(victim)) and u,
                          timeout=60, message="the victim's trial to be seen as hosted by nobody")
        assert not tracker.history.get(victim), "the liar's results were taken for the victim's"
        assert update.state is TrialState.MISSING, update
        assert restarted.describe(victim) is None
    finally:
        _cleanup(ray_local, x, y)


def test_a_dedicated_actor_claiming_a_sibling_trial_is_not_adopted(ray_local):
    prefix = f"it/d{uuid.uuid4().hex[:8]}/"
    first = RayExecutor(ray_local, reuse_actors=False)
    try:
        liar, sibling = f"{prefix}liar-0", f"{prefix}sibling-1"
        first.start(launch(liar, CLAIMS, {"claim": sibling, "interval": 0.02}))
        first.start(launch(sibling, SLEEPY, {"interval": 0.02}))
        Tracker(first).until(sibling, lambda u: u.results)
        restarted = RayExecutor(ray_local, reuse_actors=False)
        tracker = Tracker(restarted)
        tracker.until(sibling, lambda u: u.results)
        assert restarted.describe(sibling)["name"].endswith("sibling-1")
    finally:
        _cleanup(ray_local, prefix)
