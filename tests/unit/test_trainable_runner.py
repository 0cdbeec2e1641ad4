"""The function runner without Ray: results, seq/iteration, errors, stop, pause."""
from __future__ import annotations

import math

import threading

import pytest

import kubetune
from kubetune.trainable.api import get_context
from kubetune.trainable.api import NoTrialError
from kubetune.trainable.function_runner import (COMPLETED, FAILED, RUNNING, STOPPED,
                                                FunctionRunner)


def run(function, **kwargs) -> FunctionRunner:
    runner = FunctionRunner(function, trial_key=kwargs.pop("trial_key", "ns/exp/exp-0"),
                            config=kwargs.pop("config", {}), **kwargs)
    runner.start()
    return runner


def finished(runner: FunctionRunner) -> FunctionRunner:
    assert runner.join(timeout=10), "the function did not end"
    return runner


def test_results_are_numbered_and_fetched_idempotently():
    def train(config):
        for i in range(5):
            kubetune.report({"loss": config["a"] * i})

    runner = finished(run(train, config={"a": 2}))
    batch = runner.fetch(0)
    assert batch["state"] == COMPLETED
    assert [r["seq"] for r in batch["results"]] == [1, 2, 3, 4, 5]
    assert [r["iteration"] for r in batch["results"]] == [1, 2, 3, 4, 5]
    assert [r["metrics"]["loss"] for r in batch["results"]] == [0, 2, 4, 6, 8]
    assert runner.fetch(0) == batch
    assert [r["seq"] for r in runner.fetch(3)["results"]] == [4, 5]
    assert runner.fetch(5)["results"] == [] and runner.fetch(5)["state"] == COMPLETED


def test_limit_holds_back_the_terminal_state_until_the_last_result():
    def train(config):
        for i in range(3):
            kubetune.report({"i": i})
        raise ValueError("boom")

    runner = finished(run(train))
    first = runner.fetch(0, limit=2)
    assert [r["seq"] for r in first["results"]] == [1, 2]
    assert first["state"] == RUNNING and first["error"] == ""
    rest = runner.fetch(2, limit=2)
    assert [r["seq"] for r in rest["results"]] == [3]
    assert rest["state"] == FAILED


def test_exception_fails_with_type_message_and_traceback_after_earlier_results():
    def train_that_raises(config):
        kubetune.report({"loss": 1.0})
        kubetune.report({"loss": 0.5})
        raise ValueError("diverged at lr=3")

    batch = finished(run(train_that_raises)).fetch(0)
    assert len(batch["results"]) == 2
    assert batch["state"] == FAILED
    assert batch["error"].startswith("ValueError: diverged at lr=3\n")
    assert "train_that_raises" in batch["error"] and "Traceback" in batch["error"]


def test_a_long_traceback_reaches_the_operator_whole():
    """The results store keeps every failed attempt's whole traceback (issue 14)."""
    def descend(depth):
        if depth == 0:
            raise RuntimeError("bottom")
        return descend_again(depth - 1)

    def descend_again(depth):   # two names: Python does not fold the frames into one line
        return descend(depth)

    def train_deep(config):
        descend(200)

    error = finished(run(train_deep)).fetch(0)["error"]
    assert len(error) > 20_000 and error.count(", in descend_again\n") == 200
    assert "in train_deep" in error and error.rstrip().endswith("RuntimeError: bottom")


def test_seq_and_iteration_continue_from_the_launch():
    def train(config):
        assert get_context().start_iteration == 7
        kubetune.report({"x": 1})
        kubetune.report({"x": 2})

    runner = finished(run(train, start_iteration=7, start_seq=12, attempt=2))
    results = runner.fetch(12)["results"]
    assert [(r["seq"], r["iteration"]) for r in results] == [(13, 8), (14, 9)]
    assert [r["seq"] for r in runner.fetch(0)["results"]] == [13, 14]
    assert runner.fetch(0)["attempt"] == 2


def test_a_function_returning_without_a_single_report_fails_naming_the_reporting_calls():
    def train(config):
        return {"loss": 1.0}     # returned, never reported: a Ray Tune user's habit

    batch = finished(run(train)).fetch(0)
    assert batch["state"] == FAILED and batch["results"] == []
    assert batch["error"].startswith("NoResultsReported: the function ")
    assert "train returned without reporting a single result" in batch["error"]
    for call in ("kubetune.report", "ray.tune.report", "ray.train.report", "ray.air.session.report"):
        assert call in batch["error"]


def test_a_resumed_attempt_with_nothing_left_to_do_may_return_without_reporting():
    batch = finished(run(lambda config: None, start_iteration=10, start_seq=10, attempt=1)).fetch(10)
    assert batch["state"] == COMPLETED and batch["results"] == []


def test_function_without_arguments_is_called_without_config():
    seen = []
    finished(run(lambda: seen.append(kubetune.get_config()) or kubetune.report({"x": 1}), config={"lr": 0.1}))
    assert seen == [{"lr": 0.1}]


def test_stop_ends_the_function_at_its_next_report():
    reported_once = threading.Event()
    proceed = threading.Event()
    after_stop = []

    def train(config):
        kubetune.report({"i": 1})
        reported_once.set()
        proceed.wait(10)
        try:
            kubetune.report({"i": 2})
        except Exception:  # a broad except in user code must not swallow the stop
            after_stop.append("swallowed")
        after_stop.append("continued")

    runner = run(train)
    assert reported_once.wait(10)
    runner.request_stop()
    assert runner.state == RUNNING
    proceed.set()
    batch = finished(runner).fetch(0)
    assert batch["state"] == STOPPED and batch["error"] == ""
    assert [r["metrics"]["i"] for r in batch["results"]] == [1, 2]
    assert after_stop == []


def test_pause_waits_for_a_report_that_carries_a_checkpoint(tmp_path):
    go = threading.Event()
    flags = []

    def train(config):
        go.wait(10)
        kubetune.report({"i": 1})                      # no checkpoint: goes on
        flags.append(get_context().should_checkpoint)
        checkpoint = tmp_path / "ckpt"
        checkpoint.mkdir()
        kubetune.report({"i": 2}, checkpoint=checkpoint)
        flags.append("not reached")

    runner = run(train, storage=str(tmp_path / "store"))
    runner.request_stop(at_checkpoint=True)
    go.set()
    batch = finished(runner).fetch(0)
    assert batch["state"] == STOPPED
    assert flags == [True]
    assert batch["checkpoint"] == batch["results"][-1]["checkpoint"]
    assert batch["checkpoint"].endswith("ns/exp/exp-0/checkpoint-000002")


def test_fetch_waits_for_news():
    release = threading.Event()

    def train(config):
        release.wait(10)
        kubetune.report({"i": 1})

    runner = run(train)
    assert runner.fetch(0, wait_s=0.01)["results"] == []
    release.set()
    batch = runner.fetch(0, wait_s=10)
    assert [r["seq"] for r in batch["results"]] == [1]
    finished(runner)


def test_metrics_are_numbers_or_strings_non_finite_ones_too_and_bad_ones_fail_the_trial():
    class Scalar:
        def item(self):
            return 0.25

    def train(config):
        kubetune.report({"a": Scalar(), "b": "warmup", "nan": math.nan, "inf": -math.inf, "big": 2 ** 63 - 1})
        kubetune.report({"b": (1, 2)})

    batch = finished(run(train)).fetch(0)
    metrics = batch["results"][0]["metrics"]
    assert {k: metrics[k] for k in ("a", "b", "inf", "big")} == {"a": 0.25, "b": "warmup", "inf": -math.inf,
                                                                 "big": 2 ** 63 - 1}
    assert math.isnan(metrics["nan"])
    assert batch["state"] == FAILED
    assert batch["error"].startswith("MetricError: metric 'b' is a tuple; report numbers or strings")


def test_an_integer_outside_int64_fails_the_trial_with_a_clear_error():
    def train(config):
        kubetune.report({"step": 2 ** 64})

    batch = finished(run(train)).fetch(0)
    assert batch["results"] == [] and batch["state"] == FAILED
    assert "metric 'step' is 18446744073709551616, outside the 64-bit integer range" in batch["error"]


def test_entrypoint_string_is_imported_in_the_trial():
    runner = finished(run("kubetune.examples.quadratic:train", config={"x": 1, "y": -2}))
    results = runner.fetch(0)["results"]
    assert [r["metrics"]["val_loss"] for r in results] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5])
    assert all("gpus" not in r["metrics"] for r in results)     # a CPU trial: val_loss alone


def test_the_quadratic_reports_the_gpus_ray_gave_the_trial(monkeypatch):
    # what Ray sets in a trial's process for resources.gpu: 2 (the real-node KubeRay test
    # reads "gpus" to see that its trials got their logical GPUs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    results = finished(run("kubetune.examples.quadratic:train", config={"iterations": 2})).fetch(0)["results"]
    assert [r["metrics"]["gpus"] for r in results] == [2, 2]


def test_bad_entrypoint_fails_the_trial_with_a_clear_message():
    batch = finished(run("kubetune.examples.nope:train")).fetch(0)
    assert batch["state"] == FAILED
    assert batch["error"].startswith(
        "EntrypointError: cannot load entrypoint 'kubetune.examples.nope:train': "
        "ModuleNotFoundError")


def test_api_outside_a_trial_raises_a_clear_error():
    with pytest.raises(NoTrialError, match=r"kubetune.report\(\) was called outside a trial"):
        kubetune.report({"loss": 1})
    with pytest.raises(NoTrialError):
        kubetune.get_config()


def test_concurrent_trials_in_one_process_keep_their_own_sessions():
    barrier = threading.Barrier(2, timeout=10)

    def train(config):
        barrier.wait()
        kubetune.report({"who": kubetune.get_config()["who"]})

    a, b = run(train, config={"who": "a"}, trial_key="ns/e/a"), run(train, config={"who": "b"},
                                                                     trial_key="ns/e/b")
    assert finished(a).fetch(0)["results"][0]["metrics"] == {"who": "a"}
    assert finished(b).fetch(0)["results"][0]["metrics"] == {"who": "b"}
