"""`kubetune run FILE`: the same Experiment file with no Kubernetes, on embedded Ray or,
with `--platform local`, as processes of this host with no Ray at all."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def without_ray(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import ray`` fails, as where Ray is not installed."""
    (tmp_path / "no-ray" / "ray").mkdir(parents=True)
    (tmp_path / "no-ray" / "ray" / "__init__.py").write_text('raise ImportError("no Ray here")\n')
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "no-ray"), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("platform", ["ray", "local"])
def test_quickstart_runs_without_a_cluster(tmp_path, platform):
    manifest = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    manifest["spec"]["trial"]["config"]["delay"] = 0.01     # same run, less waiting
    path = tmp_path / "quickstart.yaml"
    path.write_text(yaml.safe_dump(manifest))
    env_overrides = {"KUBECONFIG": str(tmp_path / "no-such-kubeconfig"), "RAY_USAGE_STATS_ENABLED": "0",
                     **(without_ray(tmp_path) if platform == "local" else {})}
    completed = subprocess.run([sys.executable, "-m", "kubetune", "run", str(path), "--output", "json",
                                "--platform", platform, "--results-url", f"sqlite:///{tmp_path}/results.db"],
                               capture_output=True, text=True, timeout=300, env={**os.environ, **env_overrides})
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads(completed.stdout)
    assert summary["status"]["phase"] == "Succeeded"
    trials = summary["trials"]
    assert [t["name"] for t in trials] == [f"quickstart-{i}" for i in range(8)]
    assert all(t["phase"] == "Succeeded" and t["iteration"] == 5 for t in trials)
    best = min(trials, key=lambda t: t["bestMetric"])
    assert summary["status"]["bestTrial"]["name"] == best["name"]
    assert summary["status"]["bestTrial"]["metric"] == pytest.approx(best["bestMetric"])
    # each trial's usage (issue 27): 5 iterations ran on the host, one CPU each, nothing queued
    assert all(t["usage"]["runSeconds"] > 0 and t["usage"]["cpuSeconds"] == pytest.approx(t["usage"]["runSeconds"])
               and t["usage"]["gpuSeconds"] == 0 for t in trials)
    assert summary["status"]["usage"]["runSeconds"] == pytest.approx(sum(t["usage"]["runSeconds"] for t in trials),
                                                                     abs=0.01)


def test_an_invalid_file_names_the_field(tmp_path):
    manifest = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    manifest["spec"]["searchSpace"]["x"] = {"loguniform": [0, 1]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(manifest))
    completed = subprocess.run([sys.executable, "-m", "kubetune", "run", str(path), "--output", "json"],
                               capture_output=True, text=True, timeout=120, env=os.environ)
    assert completed.returncode != 0
    summary = json.loads(completed.stdout)
    assert summary["status"]["phase"] == "Failed"
    assert "spec.searchSpace.x" in summary["status"]["message"]


def test_a_local_trial_asking_for_a_gpu_fails_naming_it(tmp_path):
    """This host's ledger holds its CPUs and no GPU: the Experiment fails at once, saying so."""
    manifest = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    manifest["spec"]["trial"]["resources"] = {"cpu": 1, "gpu": 1}
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(manifest))
    completed = subprocess.run([sys.executable, "-m", "kubetune", "run", str(path), "--output", "json",
                                "--platform", "local", "--results-url", f"sqlite:///{tmp_path}/results.db"],
                               capture_output=True, text=True, timeout=120, env={**os.environ, **without_ray(tmp_path)})
    assert completed.returncode != 0
    summary = json.loads(completed.stdout)
    assert summary["status"]["phase"] == "Failed"
    failed = next(c for c in summary["status"]["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "Infeasible")
    assert "needs 1 GPU" in summary["status"]["message"], summary["status"]["message"]
