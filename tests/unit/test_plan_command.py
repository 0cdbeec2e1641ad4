"""``kubetune plan FILE``: the table a reviewer reads, the JSON, node types from a
RayCluster, and seconds per iteration measured from an earlier Experiment's results."""
from __future__ import annotations

import json
import pathlib

from kubetune.cli import main
from kubetune.results import open_store
from kubetune.results.rows import Batch, ExperimentRow, ResultRow, TrialRow

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "kuberay" / "experiment.yaml")
CLUSTER = str(ROOT / "examples" / "kuberay" / "raycluster.yaml")


def test_the_kuberay_example_plans_as_a_table(capsys):
    assert main(["plan", EXAMPLE, "--cluster", CLUSTER]) == 0
    out = capsys.readouterr().out
    assert "16 trials, scheduler asha, maxIterations 20, 4 at once" in out
    assert "(from spec.trial.expectedIterationSeconds)" in out
    assert "| GPU-hours |" in out and "| peak parallel GPUs | 4 | 4 |" in out
    assert "| 2 | 0 | 16.0 | 16 |" in out            # everyone reaches the first rung
    assert "| gpu | 1 | 8 |" in out and "| cpu | 0 | 0 |" in out


def test_json_has_every_figure(capsys):
    assert main(["plan", EXAMPLE, "-o", "json", "--cluster", CLUSTER]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["experiment"] == "kuberay-gpu" and body["peakGpus"] == 4 and body["fits"] is True
    assert body["gpuHours"]["worst"] == round(16 * 20 * 1.0 / 3600, 3)
    assert 0 < body["gpuHours"]["expected"] < body["gpuHours"]["worst"]
    assert [r["iteration"] for r in body["rungs"]] == [2, 6, 18, 20]


def test_seconds_per_iteration_measured_from_an_earlier_experiment(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    store = open_store(url)
    # one trial, two attempts: 4 s per iteration, and a 100 s gap before the retry that is not an iteration
    results = [ResultRow("t1", seq, it, {"val_loss": 1.0}, time=t, attempt=a)
               for seq, (it, t, a) in enumerate([(1, 10.0, 0), (2, 14.0, 0), (3, 18.0, 0), (4, 118.0, 1), (5, 122.0, 1)])]
    store.write(Batch(experiments=[ExperimentRow("u1", "default", "earlier")],
                      trials=[TrialRow("t1", "u1", "earlier-0")], results=results))
    store.close()
    assert main(["plan", EXAMPLE, "-o", "json", "--measured", "earlier", "--store", url]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["secondsPerIteration"] == 4.0
    assert body["secondsPerIterationSource"].startswith("measured: default/earlier (5 results)")


def test_a_spec_without_max_iterations_names_the_field(tmp_path, capsys):
    path = tmp_path / "e.yaml"
    path.write_text("kind: Experiment\nmetadata: {name: e}\nspec:\n  objective: {metric: m, mode: min}\n"
                    "  searchSpace: {x: {uniform: [0, 1]}}\n  trial: {entrypoint: a.b:c}\n")
    assert main(["plan", str(path)]) == 2
    assert "spec.scheduler.maxIterations" in capsys.readouterr().err
