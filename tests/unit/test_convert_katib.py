"""`kubetune convert katib`: Katib v1beta1 Experiments (written from Katib's published API)
as kubetune Experiments with pod trials, and the wrapper that collects Katib's metrics."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kubetune.convert import katib_metrics
from kubetune.convert.common import ConversionError, render
from kubetune.convert.katib import from_katib
from kubetune.executors.pods.stdout_results import ResultLine, ResultLines
from kubetune.spec.parse import parse_experiment

KATIB = Path(__file__).resolve().parent / "katib"


def convert(name: str) -> dict:
    body, conversion = from_katib(str(KATIB / name))
    return yaml.safe_load(render(conversion, body))


def wrapper_of(container: dict) -> tuple[dict, list[str]]:
    command = container["command"]
    assert command[:2] == ["python3", "-c"] and "KUBETUNE_RESULT" in command[2]
    return json.loads(command[3]), command[4:]


def test_random_search_with_a_job_template_and_the_stdout_collector():
    body = convert("random-stdout-job.yaml")
    spec = body["spec"]
    assert body["metadata"] == {"name": "random", "namespace": "kubeflow"}
    assert spec["executor"] == "pod"
    assert spec["objective"] == {"metric": "Validation-accuracy", "mode": "max", "goal": 0.99}
    assert spec["searchSpace"] == {"lr": {"uniform": [0.01, 0.03]}, "num-layers": {"randint": [2, 6]},
                                   "optimizer": {"choice": ["sgd", "adam", "ftrl"]},
                                   "batch-size": {"ordinal": [16, 32, 64]}}   # discrete: numbers in order
    assert spec["search"] == {"algorithm": "random", "seed": 10}
    assert spec["budget"] == {"maxTrials": 12, "parallelism": 3, "maxFailedTrials": 3}
    trial = spec["trial"]
    assert trial["metricsCollector"] == "stdout" and trial["maxFailures"] == 2
    assert trial["template"]["metadata"] == {"annotations": {"sidecar.istio.io/inject": "false"}}
    (container,) = trial["template"]["spec"]["containers"]
    settings, command = wrapper_of(container)
    assert settings == {"objective": "Validation-accuracy", "metrics": ["Train-accuracy"], "source": "StdOut"}
    assert command == ["python3", "/opt/mxnet-mnist/mnist.py", "--batch-size=${params.batch-size}",
                       "--lr=${params.lr}", "--num-layers=${params.num-layers}", "--optimizer=${params.optimizer}"]
    parse_experiment(spec)


def test_tpe_with_medianstop_a_pod_template_and_a_file_collector():
    spec = convert("tpe-medianstop-file.yaml")["spec"]
    assert spec["searchSpace"] == {"lr": {"loguniform": [0.0001, 0.1]}}
    assert spec["search"] == {"algorithm": "tpe"}
    assert spec["scheduler"] == {"type": "median", "gracePeriod": 3}
    pod = spec["trial"]["template"]["spec"]
    (container,) = pod["containers"]
    settings, command = wrapper_of(container)
    assert settings["source"] == "File" and settings["path"] == "/katib/train.log" and settings["format"] == "TEXT"
    assert settings["formats"] == ["{metricName: ([\\w|-]+), metricValue: ((-?\\d+)(\\.\\d+)?)}"]
    assert command == ["python3", "/app/train.py", "--lr", "${params.lr}"]      # args joined the command
    assert {"name": "katib-metrics", "emptyDir": {}} in pod["volumes"]
    assert {"name": "katib-metrics", "mountPath": "/katib"} in container["volumeMounts"]


def test_grid_search_with_steps_and_the_json_file_format():
    spec = convert("grid-json.yaml")["spec"]
    assert spec["search"] == {"algorithm": "grid"}
    assert spec["searchSpace"] == {"lr": {"quniform": [0.01, 0.03, 0.01]}, "momentum": {"choice": ["0.5", "0.9"]}}
    settings, _ = wrapper_of(spec["trial"]["template"]["spec"]["containers"][0])
    assert settings["format"] == "JSON" and settings["metrics"] == ["loss"]


def test_what_has_no_equivalent_is_named():
    with pytest.raises(ConversionError) as refused:
        convert("unmappable.yaml")
    found = {(r.what, r.where) for r in refused.value.refusals}
    assert ("algorithmName enas", "spec.algorithm") in found
    assert ("distribution normal", "spec.parameters[0].feasibleSpace") in found
    assert ("trialSpec kind TFJob", "spec.trialTemplate.trialSpec") in found


def collected(settings: dict, command: list[str], cwd: Path) -> tuple[int, list[dict], str]:
    done = subprocess.run([sys.executable, "-c", Path(katib_metrics.__file__).read_text(), json.dumps(settings),
                           *command], capture_output=True, text=True, timeout=60, cwd=cwd)
    lines = ResultLines(first_seq=0, start_iteration=0, attempt=0)
    results = [r for r in map(lines.feed, done.stdout.splitlines()) if r is not None]
    assert all(isinstance(r, ResultLine) for r in results), results
    return done.returncode, [r.body["metrics"] for r in results], done.stdout


def test_the_wrapper_turns_katibs_name_value_lines_into_results(tmp_path):
    program = ("import sys\n"
               "for epoch in range(3):\n"
               "    print(f'epoch {epoch}: Train-accuracy={0.5 + epoch / 10}')\n"
               "    print(f'Validation-accuracy={0.4 + epoch / 10:.2f} other=7')\n"
               "sys.exit(3)\n")
    code, results, out = collected({"objective": "Validation-accuracy", "metrics": ["Train-accuracy"],
                                    "source": "StdOut"}, [sys.executable, "-c", program], tmp_path)
    assert code == 3                            # the child's exit status
    assert "epoch 2: Train-accuracy=0.7" in out  # its output passes through
    assert results == [{"Train-accuracy": 0.5, "Validation-accuracy": 0.4},
                       {"Train-accuracy": 0.6, "Validation-accuracy": 0.5},
                       {"Train-accuracy": 0.7, "Validation-accuracy": 0.6}]


def test_the_wrapper_reads_a_json_metrics_file_once_the_training_ended(tmp_path):
    path = tmp_path / "m.json"
    program = (f"import json\nwith open({str(path)!r}, 'w') as f:\n"
               "    for e in range(2): f.write(json.dumps({'epoch': e, 'loss': 1 / (e + 1), 'accuracy': e / 2, "
               "'timestamp': '2021-12-02T14:27:51'}) + '\\n')\n")
    code, results, _ = collected({"objective": "accuracy", "metrics": ["loss"], "source": "File",
                                  "path": str(path), "format": "JSON"}, [sys.executable, "-c", program], tmp_path)
    assert code == 0
    assert results == [{"loss": 1.0, "accuracy": 0.0}, {"loss": 0.5, "accuracy": 0.5}]


def test_the_command_converts_a_file(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kubetune", "convert", "katib", str(KATIB / "grid-json.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["spec"]["executor"] == "pod"
    bad = subprocess.run([sys.executable, "-m", "kubetune", "convert", "katib", str(KATIB / "unmappable.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "spec.algorithm: algorithmName enas" in bad.stderr


def test_a_discrete_list_beyond_the_ordinal_range_stays_a_choice():
    # an ordinal's values lie within +-2^53 (the parser refuses others); a choice's need not
    from kubetune.convert.common import Conversion
    from kubetune.convert.katib import _parameters
    space = _parameters([{"name": "seed", "parameterType": "discrete",
                          "feasibleSpace": {"list": ["1", "18014398509481984"]}},
                         {"name": "bs", "parameterType": "discrete", "feasibleSpace": {"list": ["64", "16", "32"]}}],
                        Conversion("the Katib Experiment"))
    assert space == {"seed": {"choice": [1, 18014398509481984]}, "bs": {"ordinal": [16, 32, 64]}}
