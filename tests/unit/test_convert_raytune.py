"""`kubetune convert raytune`: a Tuner script, run with the Tuner intercepted, as an Experiment."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.tune")

from kubetune.convert.common import ConversionError, render  # noqa: E402
from kubetune.convert.raytune_capture import capture  # noqa: E402
from kubetune.convert.raytune_map import to_experiment  # noqa: E402
from kubetune.spec.parse import parse_experiment  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "raytune_scripts"
RAY_EXAMPLES = Path(__import__("ray.tune.examples", fromlist=["x"]).__file__).parent


def convert(script: Path, *args: str) -> dict:
    body, conversion = to_experiment(capture(str(script), list(args)))
    text = render(conversion, body)
    assert text.startswith("# Converted by `kubetune convert`")
    return yaml.safe_load(text)


def test_every_mapped_construct_lands_in_its_field():
    body = convert(SCRIPTS / "every_domain.py")
    spec = body["spec"]
    assert body["metadata"]["name"] == "every-domain"
    assert spec["objective"] == {"metric": "loss", "mode": "min"}
    assert spec["searchSpace"] == {
        "lr": {"loguniform": [1e-4, 1e-1]}, "momentum": {"uniform": [0.5, 0.99]},
        "layers": {"randint": [1, 5]}, "width": {"quniform": [32, 256, 32]},
        "dropout": {"quniform": [0.0, 0.5, 0.1]}, "optimizer": {"choice": ["sgd", "adam"]},
        "seed": {"randint": [0, 10]}}     # random.randint includes 9, kubetune's randint excludes high
    assert spec["search"] == {"algorithm": "tpe", "seed": 7}
    assert spec["scheduler"] == {"type": "asha", "maxIterations": 20, "gracePeriod": 2, "reductionFactor": 3}
    assert spec["budget"] == {"maxTrials": 12, "parallelism": 3, "maxDuration": "600s"}
    assert spec["trial"] == {"entrypoint": "every_domain:train", "resources": {"cpu": 2, "gpu": 1},
                             "maxFailures": 3, "config": {"epochs": 3}}
    assert spec["checkpoint"] == {"keepLast": 2}
    parse_experiment(spec)


def test_what_cannot_map_is_refused_by_name_with_its_line():
    with pytest.raises(ConversionError) as refused:
        convert(SCRIPTS / "unmappable.py")
    found = {(r.what, r.where) for r in refused.value.refusals}
    assert ("param_space['a'] = tune.sample_from(...)", "unmappable.py:20") in found
    assert ("param_space['b'] = tune.randn(...)", "unmappable.py:17") in found      # the Tuner's line
    assert ("MyScheduler", "unmappable.py:23") in found
    assert ("stop={'mean_accuracy': 0.9}", "unmappable.py:17") in found


def test_tune_run_is_intercepted_too_and_a_pure_grid_is_a_grid_search():
    spec = convert(SCRIPTS / "with_tune_run.py")["spec"]
    assert spec["searchSpace"] == {"x": {"choice": [1, 2, 3]}}
    assert spec["search"] == {"algorithm": "grid"}
    assert spec["budget"]["maxTrials"] == 6          # num_samples x the grid, as Ray runs it
    assert spec["objective"] == {"metric": "score", "mode": "max"}
    assert spec["scheduler"] == {"type": "fifo", "maxIterations": 4}
    assert spec["trial"]["maxFailures"] == 1


def test_the_pbt_class_example_from_the_ray_wheel():
    spec = convert(RAY_EXAMPLES / "pbt_example.py", "--smoke-test")["spec"]
    assert spec["trial"]["entrypoint"] == "ray.tune.examples.pbt_example:PBTBenchmarkExample"
    # hyperparam_mutations: a lambda of an exact form, and a list
    assert spec["searchSpace"] == {"lr": {"uniform": [0.0001, 0.02]}, "some_other_factor": {"choice": [1, 2]}}
    assert spec["scheduler"]["type"] == "pbt" and spec["scheduler"]["perturbationInterval"] == 5
    assert spec["scheduler"]["maxIterations"] == 10
    assert spec["trial"]["config"] == {"__checkpoint_frequency__": 5}
    assert spec["objective"] == {"metric": "mean_accuracy", "mode": "max"}


def test_the_multi_objective_optuna_example_gives_two_objectives():
    spec = convert(RAY_EXAMPLES / "optuna_multiobjective_example.py", "--smoke-test")["spec"]
    assert spec["objectives"] == [{"metric": "loss", "mode": "min"}, {"metric": "gain", "mode": "max"}]
    assert spec["budget"] == {"maxTrials": 10, "parallelism": 4}


def test_the_command_prints_the_experiment_and_exits_2_naming_refusals(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "kubetune", "convert", "raytune",
                         str(SCRIPTS / "with_tune_run.py")], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert yaml.safe_load(ok.stdout)["kind"] == "Experiment"
    bad = subprocess.run([sys.executable, "-m", "kubetune", "convert", "raytune",
                          str(SCRIPTS / "unmappable.py")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "unmappable.py:23: MyScheduler: no kubetune scheduler matches it" in bad.stderr


def test_a_script_that_fails_before_its_tuner_says_why(tmp_path):
    from kubetune.convert.raytune_capture import NoTuner
    script = tmp_path / "broken.py"
    script.write_text("import no_such_module_here\n")
    with pytest.raises(NoTuner, match="raised ModuleNotFoundError: No module named 'no_such_module_here' "
                                      "before it created a Tuner"):
        capture(str(script), [])
    script.write_text("print('no tuner')\n")
    with pytest.raises(NoTuner, match="ended without creating a ray.tune.Tuner"):
        capture(str(script), [])
