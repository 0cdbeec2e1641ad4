"""The trial host (body of the Ray actor) without Ray: reuse, idempotence, logs, idle exit."""
from __future__ import annotations

import io
import threading

from kubetune.trainable.host import UNKNOWN, TrialHost
from kubetune.trainable.output import LineBuffer, _Tee
from unit_helpers import wait_for


def launch(trial_key: str, entrypoint: str = "kubetune.examples.quadratic:train",
           attempt: int = 0, **config) -> dict:
    return {"trial_key": trial_key, "entrypoint": entrypoint, "config": config,
            "checkpoint": None, "start_iteration": 0, "start_seq": 0, "attempt": attempt,
            "storage": "", "keep_last": 2}


def test_a_host_runs_trials_one_after_another():
    host = TrialHost("w", "pool", capture_output=False)
    host.assign(launch("ns/e/a", x=1, y=-2))
    first = wait_for(lambda: (b := host.fetch("ns/e/a", 0)) and b["state"] == "completed" and b)
    assert len(first["results"]) == 5
    host.release("ns/e/a")
    assert host.describe()["trial_key"] is None
    host.assign(launch("ns/e/b", x=0, y=0))
    assert host.fetch("ns/e/a", 0)["state"] == UNKNOWN
    wait_for(lambda: host.fetch("ns/e/b", 0)["state"] == "completed")
    assert host.describe()["hosted"] == 2


def test_assign_is_idempotent_and_refuses_a_second_running_trial():
    host = TrialHost("w", capture_output=False)
    first = host.assign(launch("ns/e/a", "kubetune.examples.sleepy:train", interval=3600))
    assert first["trial_key"] == "ns/e/a" and not first["attached"]
    assert host.assign(launch("ns/e/a", "kubetune.examples.sleepy:train"))["attached"]
    assert "busy with ns/e/a" in host.assign(launch("ns/e/b"))["refused"]
    result = host.stop("ns/e/a", timeout_s=0.05)
    assert result["ended"] is False        # stuck before its next report: must be killed
    assert host.describe()["trial_key"] == "ns/e/a"


def test_stop_reaches_a_function_waiting_inside_a_long_step(tmp_path):
    host = TrialHost("w", capture_output=False)
    host.assign(launch("ns/e/a", "kubetune.examples.sleepy:train", interval=0,
                       hold_after=2, gate=str(tmp_path / "never")))
    wait_for(lambda: len(host.fetch("ns/e/a", 0)["results"]) == 2)
    final = host.stop("ns/e/a", timeout_s=10, after_seq=2)
    assert final["ended"] and final["state"] == "stopped"
    assert [r["iteration"] for r in final["results"]] == [3]   # ended at its next report


def test_stop_returns_the_results_after_a_seq(tmp_path):
    host = TrialHost("w", capture_output=False)
    host.assign(launch("ns/e/a", "kubetune.examples.sleepy:train", interval=0.001))
    wait_for(lambda: len(host.fetch("ns/e/a", 0)["results"]) >= 3)
    final = host.stop("ns/e/a", timeout_s=10, after_seq=2)
    assert final["ended"] and final["state"] == "stopped"
    assert final["results"][0]["seq"] == 3
    assert host.describe()["trial_key"] is None


def test_output_is_teed_into_a_ring_buffer_of_lines():
    buffer, original = LineBuffer(max_lines=3), io.StringIO()
    tee = _Tee(original, lambda: buffer)
    for text in ["one\n", "two\nthree\n", "four", "\nfive"]:
        tee.write(text)
    assert original.getvalue() == "one\ntwo\nthree\nfour\nfive"
    assert buffer.tail() == "two\nthree\nfour\nfive"     # 3 whole lines + the partial one
    assert buffer.tail(2) == "four\nfive"


def test_an_idle_host_ends_itself_and_a_running_one_does_not(tmp_path):
    ended = threading.Event()
    host = TrialHost("w", capture_output=False, idle_timeout_s=0.05, orphan_timeout_s=0.1,
                     on_idle=ended.set)
    gate = tmp_path / "gate"
    host.assign(launch("ns/e/a", "kubetune.examples.sleepy:train", hold_after=0,
                       gate=str(gate), iterations=1))
    assert not ended.wait(0.3)        # running (blocked on its gate): never ended
    gate.touch()
    assert ended.wait(10)             # finished, nobody fetched: orphan timeout
