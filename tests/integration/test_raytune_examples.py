"""The Ray Tune examples shipped in the `ray` wheel run under kubetune with no edit (issue 29):
each script is converted (`kubetune convert raytune`), the Experiment is made smaller for the
test (fewer trials and iterations, nothing else), and it runs through `kubetune run` and through
the operator, on real Ray; the trials import the examples from the installed package."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k8s_helpers import create, get_experiment, trials
from kube_fixtures import wait_for


pytestmark = pytest.mark.integration
RAY_EXAMPLES = Path(__import__("ray.tune.examples", fromlist=["x"]).__file__).parent

# example -> (maxTrials, what the test shrinks in spec.trial.config, spec.scheduler)
EXAMPLES = {
    "tune_basic_example": (2, {"steps": 3}, {}),
    "async_hyperband_example": (2, {"steps": 4}, {"maxIterations": 4, "gracePeriod": 1}),
    "optuna_example": (2, {"steps": 4}, {"maxIterations": 4}),
    "optuna_multiobjective_example": (2, {"steps": 3}, {}),
    # the class API; four trials, so that PBT's bottom quarter (one) exploits the top one
    "pbt_example": (4, {}, {"maxIterations": 6, "perturbationInterval": 2}),
}


def converted(example: str) -> dict:
    """``kubetune convert raytune EXAMPLE.py -- --smoke-test`` (in this process: the command
    itself is tested in tests/unit/test_convert_raytune.py), made smaller for the test."""
    from kubetune.convert.common import render
    from kubetune.convert.raytune_capture import capture
    from kubetune.convert.raytune_map import to_experiment

    def render_converted(captured):
        experiment, conversion = to_experiment(captured)
        return render(conversion, experiment)
    body = yaml.safe_load(render_converted(capture(str(RAY_EXAMPLES / f"{example}.py"), ["--smoke-test"])))
    max_trials, config, scheduler = EXAMPLES[example]
    spec = body["spec"]
    spec["budget"].update(maxTrials=max_trials, parallelism=min(max_trials, 4))
    spec["trial"]["resources"] = {"cpu": 0.25}       # the test head has 8 logical CPUs
    spec["trial"].setdefault("config", {}).update(config)
    if scheduler:
        spec["scheduler"].update(scheduler)
    body["metadata"]["name"] = example.replace("_", "-")[:40]
    return body


@pytest.fixture(scope="module")
def examples() -> dict[str, dict]:
    return {example: converted(example) for example in EXAMPLES}


def check_trials(example: str, phase: str, items: list[dict]) -> None:
    """Every trial reported through Ray Tune's API (Ray's own training_iteration is
    kubetune's iteration) and none failed."""
    assert phase == "Succeeded", (example, [(t["name"], t["phase"], t.get("reason")) for t in items])
    assert len(items) == EXAMPLES[example][0]
    for trial in items:
        assert trial["phase"] in ("Succeeded", "Stopped"), (example, trial)
        assert trial["iteration"] >= 1
        assert trial["lastMetrics"]["training_iteration"] == trial["iteration"], (example, trial)


def test_the_shipped_examples_run_through_kubetune_run(tmp_path, ray_local, examples):
    runs = {}
    for example, body in examples.items():
        path = tmp_path / f"{example}-small.yaml"
        path.write_text(yaml.safe_dump(body))
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "KUBECONFIG": str(tmp_path / "none")}
        runs[example] = subprocess.Popen(
            [sys.executable, "-m", "kubetune", "run", str(path), "--ray-address", ray_local, "--output", "json",
             "--results-url", f"sqlite:///{tmp_path / 'results.db'}",
             "--checkpoint-storage", str(tmp_path / "checkpoints")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for example, process in runs.items():
        stdout, stderr = process.communicate(timeout=600)
        # the summary is the last thing printed: Ray prints its workers' warnings before it
        start = 0 if stdout.startswith("{") else stdout.find("\n{") + 1
        assert start >= 0 and stdout[start:].startswith("{"), (example, stdout[-3000:], stderr[-3000:])
        summary = json.loads(stdout[start:])
        items = [{**t, "phase": t["phase"]} for t in summary["trials"]]
        check_trials(example, summary["status"]["phase"], items)
        assert process.returncode == 0
    # PBT's class API trials checkpointed through save_checkpoint (a dict, as JSON)
    assert list((tmp_path / "checkpoints").rglob("kubetune_dict_checkpoint.json"))


def test_the_shipped_examples_run_through_the_operator(operator, experiments_api, namespace, examples):
    for body in examples.values():
        create(experiments_api, namespace, body)
    names = {example: example.replace("_", "-")[:40] for example in EXAMPLES}

    def all_ended():
        phases = {e: (get_experiment(experiments_api, namespace, n).get("status") or {}).get("phase")
                  for e, n in names.items()}
        return phases if all(p in ("Succeeded", "Failed") for p in phases.values()) else None
    try:
        phases = wait_for(all_ended, timeout=420, interval=1.0, message="the five converted examples")
    except BaseException:
        print(operator.log()[-8000:])
        raise
    for example, name in names.items():
        items = [{"name": t["metadata"]["name"], "phase": t["status"].get("phase"),
                  "reason": t["status"].get("reason"), "iteration": t["status"].get("iteration", 0),
                  "lastMetrics": t["status"].get("lastMetrics") or {}}
                 for t in trials(experiments_api, namespace, name)]
        check_trials(example, phases[example], items)
    front = get_experiment(experiments_api, namespace, names["optuna_multiobjective_example"])["status"]
    assert front.get("paretoFront"), front
