"""Ray Tune trainables run unchanged as kubetune trials (issue 29), with the installed Ray:
the function runner serves ray.tune.report & co., get_checkpoint, get_context and the class API."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")

from kubetune.trainable import ray_private  # noqa: E402
from kubetune.trainable.api import NoTrialError  # noqa: E402
from kubetune.trainable.function_runner import COMPLETED, FAILED, FunctionRunner  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import raytune_trainables as trainables  # noqa: E402


def run(function, **kwargs) -> dict:
    runner = FunctionRunner(function, trial_key=kwargs.pop("trial_key", "ns/exp/exp-3"),
                            config=kwargs.pop("config", {}), **kwargs)
    runner.start()
    assert runner.join(timeout=60), "the function did not end"
    return runner.fetch(0)


def metrics(batch: dict) -> list[dict]:
    return [r["metrics"] for r in batch["results"]]


def test_the_private_ray_names_kubetune_relies_on_are_where_they_were():
    """Fails loudly when a Ray upgrade moves how ray.tune.report finds its session."""
    import ray.tune.trainable.trainable_fn_utils as fn_utils
    module = ray_private.check()
    assert fn_utils.get_session is module.get_session     # ray.tune.report asks this one
    ray_private.install_session(ray_private_probe := type("Probe", (), {"kubetune": True})())
    try:
        assert module.get_session() is ray_private_probe
    finally:
        ray_private.install_session(None)


def test_every_spelling_of_report_reaches_kubetune_in_a_fresh_trial_process(tmp_path):
    # a process of its own: Ray Train's V1/V2 choice is made when ray.train is first imported
    script = ("import json, sys; from kubetune.trainable.function_runner import FunctionRunner\n"
              "r = FunctionRunner('raytune_trainables:every_spelling', trial_key='ns/e/e-0', config={})\n"
              "r.start(); r.join(60); print(json.dumps(r.fetch(0)))\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_TRAIN_V2_ENABLED"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    batch = json.loads(done.stdout.strip().splitlines()[-1])
    assert batch["state"] == COMPLETED, batch["error"]
    assert [(m["how"], m["loss"], m["training_iteration"]) for m in metrics(batch)] == [
        ("ray.tune.report", 3.0, 1), ("ray.train.report", 2.0, 2), ("ray.air.session.report", 1.0, 3)]


def test_auto_filled_fields_are_ray_tunes_and_plain_json(tmp_path):
    batch = run(trainables.resumable, config={"steps": 3}, storage=str(tmp_path))
    assert batch["state"] == COMPLETED, batch["error"]
    first, _, last = metrics(batch)
    assert [m["training_iteration"] for m in metrics(batch)] == [1, 2, 3]
    assert last["iterations_since_restore"] == 3 and last["trial_id"] == "exp-3" and last["done"] is False
    assert last["time_total_s"] >= last["time_this_iter_s"] >= 0 and isinstance(last["timestamp"], int)
    json.dumps(batch)     # what crosses to the operator is plain JSON


@pytest.mark.parametrize("storage", ["local", "memory://raytune-compat"])
def test_a_resumed_function_gets_its_last_checkpoint_through_ray_tune_get_checkpoint(tmp_path, storage):
    storage = str(tmp_path) if storage == "local" else storage
    first = run(trainables.resumable, config={"steps": 2}, storage=storage)
    assert [m["step"] for m in metrics(first)] == [0, 1]
    checkpoint = first["results"][-1]["checkpoint"]
    assert checkpoint and checkpoint.startswith(storage)
    again = run(trainables.resumable, config={"steps": 4}, storage=storage, checkpoint=checkpoint,
                start_iteration=2, start_seq=2, attempt=1)
    assert again["state"] == COMPLETED, again["error"]
    assert [m["step"] for m in metrics(again)] == [2, 3]
    assert [m["training_iteration"] for m in metrics(again)] == [3, 4]


def test_get_context_names_the_trial_its_directory_and_resources():
    batch = run(trainables.context)
    assert batch["state"] == COMPLETED, batch["error"]
    (seen,) = metrics(batch)
    assert seen["trial_id_seen"] == seen["trial_name_seen"] == "exp-3"
    assert seen["dir_exists"] is True and seen["cpus"] >= 1


def test_a_result_that_says_done_ends_the_trial_as_finished():
    batch = run(trainables.says_done)
    assert batch["state"] == COMPLETED and [m["i"] for m in metrics(batch)] == [0, 1, 2]


def test_with_parameters_and_with_resources_wrap_a_function_that_runs_as_is(monkeypatch):
    # Ray Tune's parameter registry keeps the data in the Ray session that was up when it was
    # flushed; an integration test earlier in the same pytest run may have started and ended
    # one. Wrap afresh, with no session, as a trial process does at import
    import ray
    from ray import tune
    ray.shutdown()
    monkeypatch.setattr(trainables, "with_parameters", tune.with_parameters(trainables.with_data, data=[1, 2, 3]))
    for wrapped in (trainables.with_parameters, "raytune_trainables:with_parameters"):
        batch = run(wrapped)
        assert batch["state"] == COMPLETED and metrics(batch)[0]["total"] == 6, batch["error"]
    assert trainables.with_resources._resources is not None


def test_the_class_api_steps_checkpoints_resumes_and_cleans_up(tmp_path):
    trainables.Counter.events.clear()
    first = run(trainables.Counter, config={"stop_at": 3, "__checkpoint_frequency__": 2},
                storage=str(tmp_path))
    assert first["state"] == COMPLETED, first["error"]
    assert [m["count"] for m in metrics(first)] == [1, 2, 3]
    # every 2nd iteration, and at the end (done)
    assert [bool(r["checkpoint"]) for r in first["results"]] == [False, True, True]
    assert trainables.Counter.events == [("setup", {"stop_at": 3}), ("cleanup",)]
    trainables.Counter.events.clear()
    again = run(trainables.Counter, config={"stop_at": 5}, storage=str(tmp_path),
                checkpoint=first["results"][1]["checkpoint"], start_iteration=2, start_seq=3, attempt=1)
    assert [m["count"] for m in metrics(again)] == [3, 4, 5]
    assert [m["training_iteration"] for m in metrics(again)] == [3, 4, 5]
    assert trainables.Counter.events == [("setup", {"stop_at": 5}), ("load_checkpoint", {"count": 2}),
                                         ("cleanup",)]


def test_a_class_entrypoint_from_the_ray_wheel_runs_until_stopped(tmp_path):
    runner = FunctionRunner("ray.tune.examples.pbt_example:PBTBenchmarkExample", trial_key="ns/e/e-1",
                            config={"lr": 0.01}, storage=str(tmp_path))
    runner.start()
    deadline_results = []
    while len(deadline_results) < 3 and runner.join(0.05) is False:
        deadline_results = runner.fetch(0)["results"]
    runner.request_stop()
    assert runner.join(30)
    results = runner.fetch(0)["results"]
    assert len(results) >= 3 and all("mean_accuracy" in r["metrics"] for r in results)
    assert all(r["checkpoint"] for r in results)     # default: a checkpoint every iteration, for PBT


def test_ray_tune_report_outside_a_trial_raises_instead_of_going_nowhere():
    run(trainables.says_done)          # the session is served in this process from now on
    from ray import tune
    with pytest.raises(NoTrialError):
        tune.report({"loss": 1.0})


def test_a_ray_function_that_reports_nothing_fails_naming_the_calls():
    batch = run(lambda config: {"loss": 1.0})
    assert batch["state"] == FAILED and "ray.tune.report" in batch["error"]


def run_in_pod_process(tmp_path, entrypoint: str, config: dict) -> subprocess.CompletedProcess:
    """What a trial pod runs (``python -m kubetune.trainable.run_entrypoint``), in a process
    with the pod executor's environment; results as KUBETUNE_RESULT lines (stdout collector)."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETUNE_", "RAY_TRAIN_V2"))}
    env.update(KUBETUNE_INGEST_URL="http://127.0.0.1:9", KUBETUNE_TRIAL_TOKEN="t",
               KUBETUNE_TRIAL="ns/e/e-0", KUBETUNE_METRICS_COLLECTOR="stdout",
               KUBETUNE_CONFIG_FILE=str(tmp_path / "config.json"), KUBETUNE_FIRST_SEQ="0",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "kubetune.trainable.run_entrypoint", entrypoint],
                          capture_output=True, text=True, timeout=120, env=env)


def test_a_pod_trial_runs_a_ray_tune_function_from_the_ray_wheel_without_a_ray_cluster(tmp_path):
    from kubetune.executors.pods.stdout_results import ResultLine, ResultLines
    done = run_in_pod_process(tmp_path, "ray.tune.examples.tune_basic_example:easy_objective",
                              {"steps": 3, "width": 10, "height": 5, "activation": "relu"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = ResultLines(first_seq=0, start_iteration=0, attempt=0)
    results = [r for r in map(lines.feed, done.stdout.splitlines()) if r is not None]
    assert all(isinstance(r, ResultLine) for r in results), results
    assert [(r.body["iteration"], r.body["metrics"]["training_iteration"]) for r in results] == [
        (1, 1), (2, 2), (3, 3)]
    assert results[0].body["metrics"]["mean_loss"] == pytest.approx(10 + 0.5)


def test_a_pod_trial_that_reports_nothing_exits_1_saying_so(tmp_path):
    done = run_in_pod_process(tmp_path, "kubetune.examples.misbehaving:returns_metrics", {})
    assert done.returncode == 1
    assert "NoResultsReported: the entrypoint kubetune.examples.misbehaving:returns_metrics" in done.stderr
