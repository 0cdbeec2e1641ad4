"""A Ray driver process answers the operator as JSON, checked field by field (issue 25, N2):
what the executor returns crosses intact, anything else is refused naming the field, and
nothing the child sends is ever unpickled."""
from __future__ import annotations

import math
import os
import pickle

import pytest

from kubetune.executors.base import (ClusterResources, ExecutorError, LaunchInfo, LaunchRequest, NodeResources,
                                     TrialState, TrialUpdate)
from kubetune.executors.ray import driver_wire
from kubetune.executors.ray.driver_wire import WireError
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.spec.resources import Resources
from kubetune.spec.results import Result

KEY = "team-a/exp/exp-0"
OTHER = "team-b/exp/exp-0"


def crossed(method, value, *args, **kwargs):
    """``value`` as the child sends it and the operator reads it back."""
    call_id, ok, raw = driver_wire.read_envelope(driver_wire.envelope(7, True, value))
    assert (call_id, ok) == (7, True)
    return driver_wire.decode(method, raw, args, kwargs)


def test_what_the_executor_returns_crosses_intact():
    update = TrialUpdate(KEY, TrialState.FAILED, (
        Result(0, 1, {"loss": 0.5, "tag": "nul\0", "odd": "lone\udcff", "nan": math.inf}, 1.5e9,
               f"/ckpt/{KEY}/checkpoint-1", 0),), error="ValueError: x", attempt=0,
        checkpoint=f"/ckpt/{KEY}/checkpoint-1", iteration=1, run_started=1.7e9, run_ended=1.7e9 + 3)
    assert crossed("poll", {KEY: update}, {KEY: -1}, wait_s=0.5, limit=10) == {KEY: update}
    assert crossed("stop", update, KEY, after_seq=None) == update
    assert crossed("pause", None, KEY) is None
    request = LaunchRequest(KEY, "m:f", {})
    assert crossed("start", LaunchInfo(KEY, "actor", False, "pg"), request) == LaunchInfo(KEY, "actor", False, "pg")
    resources = ClusterResources({"CPU": 2.0}, {"CPU": 1.0},
                                 [NodeResources("n1", "10.0.0.1", {"CPU": 2.0, "GPU": 1.0}, {"CPU": 1.0})])
    assert crossed("cluster_resources", resources) == resources
    assert crossed("node_types", [Resources(cpu=4, gpu=1, custom={"tpu": 2.0})]) == [Resources(4, 1, 0, {"tpu": 2.0})]
    assert crossed("node_types", None) is None
    assert crossed("list_trials", [KEY], "team-a/exp/") == [KEY]
    assert crossed("stop_all", 3, "team-a/exp/") == 3
    assert crossed("logs", "line\n", KEY) == "line\n"
    assert crossed("connect", None) is None


def test_errors_cross_as_a_type_name_and_message_only():
    for raised, unavailable in ((RayUnavailableError("ray://x:1", "refused"), True), (ConnectionError("reset"), True),
                                (ValueError("bad config"), False)):
        _, ok, raw = driver_wire.read_envelope(driver_wire.envelope(1, False, raised))
        error = driver_wire.decode_error(raw, "ray://head.team-a:10001")
        assert not ok
        if unavailable:    # the platform's fault (reconnect), and at the operator's own address
            assert isinstance(error, RayUnavailableError) and error.address == "ray://head.team-a:10001"
        else:
            assert type(error) is ExecutorError and str(error) == "ValueError: bad config"


@pytest.mark.parametrize("method,value,args,field", [
    ("poll", {KEY: {"trial_key": OTHER, "state": "running"}}, ({KEY: -1},), "trial_key"),
    ("poll", {KEY: {"trial_key": KEY, "state": "pwned"}}, ({KEY: -1},), "state"),
    ("poll", {KEY: {"trial_key": KEY, "state": "running", "results": [{"seq": 1, "iteration": 0, "metrics": {}}]}},
     ({KEY: -1},), "iteration"),
    ("poll", {KEY: {"trial_key": KEY, "state": "running", "checkpoint": f"/ckpt/{OTHER}/checkpoint-1"}},
     ({KEY: -1},), "checkpoint"),
    ("poll", {KEY: {"trial_key": KEY, "state": "running", "error": 7}}, ({KEY: -1},), "error"),
    ("poll", {KEY: {"trial_key": KEY, "state": "running", "attempt": -3}}, ({KEY: -1},), "attempt"),
    ("stop", {"trial_key": OTHER, "state": "stopped"}, (KEY,), "trial_key"),
    ("start", {"trial_key": OTHER, "actor_name": "a", "attached": False}, (LaunchRequest(KEY, "m:f", {}),),
     "trial_key"),
    ("list_trials", [OTHER], ("team-a/exp/",), "trial keys"),
    ("cluster_resources", {"total": {"CPU": -1}, "available": {}, "nodes": []}, (), "total"),
    ("cluster_resources", {"total": {"CPU": 1e400}, "available": {}, "nodes": []}, (), "total"),
    ("stop_all", "3", ("p/",), "count"),
    ("connect", {"x": 1}, (), "null"),
    ("describe", {"trial_key": OTHER}, (KEY,), "description"),
    ("exec", None, (), "does not call"),
])
def test_anything_else_is_refused_naming_the_field(method, value, args, field):
    with pytest.raises(WireError, match=field):
        driver_wire.decode(method, value, args, {})


def test_a_poll_answer_speaks_only_for_the_trials_asked_about():
    answer = {KEY: {"trial_key": KEY, "state": "running"}, OTHER: {"trial_key": OTHER, "state": "completed"}}
    assert list(driver_wire.decode("poll", answer, ({KEY: -1},), {})) == [KEY]


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_or_an_unbounded_answer_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    for raw in (pickle.dumps((1, True, Planted(marker))), pickle.dumps(Planted(marker), protocol=0),
                b"[" * 200_000 + b"]" * 200_000, b'{"call": 1}', b"[1, 1, null]", b'["1", true, null]'):
        with pytest.raises(WireError):
            driver_wire.read_envelope(raw)
    assert not marker.exists()
    # a value the child cannot write as JSON becomes an error there, not a pickle here
    _, ok, raw = driver_wire.read_envelope(driver_wire.envelope(2, True, Planted(marker)))
    assert not ok and "not JSON" in str(driver_wire.decode_error(raw, "ray://x.y:1"))
