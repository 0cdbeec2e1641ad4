"""What a trial worker keeps, whatever the trial does: sessions scoped to their trial
(a thread it leaves behind cannot reach another trial), acknowledged results dropped,
a bounded backlog, bounded output lines.  In-process: the pieces are pure Python; the
same behaviour on a real pooled Ray worker is tests/integration/test_ray_sessions.py."""
from __future__ import annotations

import _thread
import threading
import tracemalloc

import pytest

import kubetune
from kubetune.trainable import function_runner
from kubetune.trainable.api import NoTrialError
from kubetune.trainable.function_runner import COMPLETED, FunctionRunner
from kubetune.trainable.host import TrialHost
from unit_helpers import wait_for
from kubetune.trainable.output import LineBuffer
from test_trainable_runner import finished, run


def test_a_thread_started_by_the_function_reports_into_its_trial():
    def train(config):
        helper = threading.Thread(target=lambda: kubetune.report({"from": "helper"}))
        helper.start()
        helper.join()
        kubetune.report({"from": "function"})

    runner = finished(run(train))
    assert [r["metrics"]["from"] for r in runner.fetch(0)["results"]] == ["helper", "function"]


def test_a_thread_left_behind_never_reports_into_the_next_trial(caplog):
    release, stray_ready, stray_done = threading.Event(), threading.Event(), threading.Event()
    outcomes = []

    def stray():
        stray_ready.set()
        release.wait(10)
        try:
            kubetune.report({"loss": 999.0})
            outcomes.append("dropped")
        except NoTrialError:
            outcomes.append("refused")
        stray_done.set()

    def leaky(config):
        threading.Thread(target=stray, daemon=True).start()
        stray_ready.wait(10)
        kubetune.report({"loss": 1.0})

    host = TrialHost("w", capture_output=False)
    host.assign(launch_of("ns/e/a", leaky))
    wait_for(lambda: host.fetch("ns/e/a", 0)["state"] == COMPLETED)
    assert host.release("ns/e/a", grace_s=0.0)["retire"], "a live stray thread retires the worker"
    refusal = host.assign(launch_of("ns/e/b", lambda: None))
    assert "threads left by trial ns/e/a" in refusal["refused"]

    # were the worker reused anyway, the stray's report stays in its own, ended trial
    b = run(lambda: release.wait(10) and stray_done.wait(10), trial_key="ns/e/b")
    release.set()
    finished(b)
    assert outcomes == ["dropped"]
    assert b.fetch(0)["results"] == []
    a = host._runner
    assert [r["metrics"]["loss"] for r in a.fetch(0)["results"]] == [1.0]
    assert "after trial ns/e/a (attempt 0) ended: dropped" in caplog.text


def test_a_thread_of_unknown_origin_has_no_trial():
    answers = []
    done = threading.Event()

    def native():
        try:
            kubetune.report({"loss": 999.0})
            answers.append("reported")
        except NoTrialError:
            answers.append("no trial")
        done.set()

    def train(config):
        _thread.start_new_thread(native, ())     # as a native library's thread: not ours to know
        done.wait(10)

    runner = finished(run(train))
    assert answers == ["no trial"] and runner.fetch(0)["results"] == []


def test_fetched_results_are_dropped_so_memory_stays_bounded(monkeypatch):
    monkeypatch.setattr(function_runner, "KEPT_ACKED_RESULTS", 10)
    steps, ready = threading.Semaphore(0), threading.Event()

    def train(config):
        for i in range(2000):
            kubetune.report({"loss": float(i), "blob": "x" * 1000})
            if i % 100 == 99:
                ready.set()
                steps.acquire()

    runner = run(train)
    cursor, peak = 0, 0
    tracemalloc.start()
    try:
        while runner.state == "running" or cursor < runner.last_seq:
            wait_for(lambda: ready.is_set() or runner.state != "running")
            ready.clear()
            batch = runner.fetch(cursor)
            cursor = batch["results"][-1]["seq"] if batch["results"] else cursor
            runner.fetch(cursor)                    # acknowledges them
            peak = max(peak, tracemalloc.get_traced_memory()[0])
            steps.release()
    finally:
        tracemalloc.stop()
    assert cursor == 2000
    # all 2000 results held would be > 2 MB; 100 unfetched + 10 kept are ~0.1 MB
    assert peak < 600_000, peak
    assert len(runner._results) <= 10
    assert [r["seq"] for r in runner.fetch(1995)["results"]] == [1996, 1997, 1998, 1999, 2000]


def test_a_function_far_ahead_of_the_operator_waits_and_a_stop_ends_the_wait(monkeypatch):
    monkeypatch.setattr(function_runner, "MAX_PENDING_RESULTS", 5)
    runner = run(lambda: [kubetune.report({"i": i}) for i in range(100)])
    wait_for(lambda: runner.last_seq == 5)
    assert not runner.join(timeout=0.2) and runner.last_seq == 5   # waits for the operator
    runner.fetch(3)                                                 # the operator took 3
    wait_for(lambda: runner.last_seq == 8)
    runner.request_stop()
    assert runner.join(timeout=10) and runner.state == "stopped" and runner.last_seq == 9


def test_an_oversized_result_is_refused_with_the_limit():
    runner = finished(run(lambda: kubetune.report({"blob": "x" * (function_runner.MAX_RESULT_BYTES + 1)})))
    assert runner.state == "failed" and "more than the 1048576 allowed per result" in runner.error


def test_output_without_newlines_is_bounded_and_linear():
    buffer = LineBuffer(max_lines=3, max_line_chars=100)
    for _ in range(20_000):            # 2 MB without a newline, in small writes (a progress bar)
        buffer.write("x" * 100)
    buffer.write("\nlast line\n")
    lines = buffer.tail().splitlines()
    assert lines[-1] == "last line"
    assert len(lines[0]) < 200 and "characters cut" in lines[0]


def test_output_keeps_its_last_lines():
    buffer = LineBuffer(max_lines=2)
    buffer.write("a\nb\nc")
    buffer.write("d\ne")
    assert buffer.tail() == "b\ncd\ne"


# ------------------------------------------------------------------ helpers

def launch_of(key: str, function) -> dict:
    """A launch as the executor sends it; a function runner also takes a callable."""
    return {"entrypoint": function, "trial_key": key, "config": {}, "attempt": 0,
            "start_iteration": 0, "start_seq": 0, "checkpoint": None, "storage": None, "keep_last": 2}




def test_an_error_with_a_huge_message_is_cut():
    def train():
        raise ValueError("x" * 10_000_000)

    runner = finished(run(train))
    assert runner.state == "failed" and len(runner.error) < 10_000
    assert runner.error.startswith("ValueError: xxx") and "characters cut]" in runner.error


def test_a_worker_with_stray_threads_says_so_when_asked():
    release = threading.Event()

    def leaky():
        threading.Thread(target=release.wait, args=(10,), daemon=True).start()
        kubetune.report({"x": 1})

    host = TrialHost("w", "pool", capture_output=False)
    host.assign(launch_of("ns/e/a", leaky))
    wait_for(lambda: host.fetch("ns/e/a", 0)["state"] == COMPLETED)
    host.release("ns/e/a", grace_s=0.0)
    assert host.describe()["stray_threads"] == 1     # a restarted operator retires it, not pools it
    release.set()
    wait_for(lambda: host.describe()["stray_threads"] == 0)
