"""Several objectives end to end: examples/multi-objective.yaml with ``kubetune run`` and
through the operator (real API server, real Ray, an operator restart in the middle),
then a warm-started Experiment that reuses what the first one evaluated.

The Pareto front is checked against one computed here from every Trial's own reported
results, with plain loops."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k8s_helpers import condition, create, trials, wait_condition
from kube_fixtures import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "multi-objective.yaml").read_text())
MEMORY_MAX = EXAMPLE["spec"]["constraints"][0]["max"]


def expected_front(finished: dict[str, dict]) -> set[str]:
    """Names of the feasible succeeded trials no other such trial dominates (both minimised)."""
    points = {name: (m["loss"], m["model_size"]) for name, m in finished.items() if m["memory_gb"] <= MEMORY_MAX}

    def dominates(a, b):
        return a[0] <= b[0] and a[1] <= b[1] and a != b
    return {name for name, p in points.items() if not any(dominates(q, p) for q in points.values())}


def check_front(status: dict, finished: dict[str, dict], params: dict[str, dict]) -> None:
    expected = expected_front(finished)
    front = status["paretoFront"]
    assert front["size"] == len(expected) and front["shown"] == len(front["points"]) == min(len(expected), 10)
    assert {p["trial"] for p in front["points"]} == expected
    for point in front["points"]:
        metrics = finished[point["trial"]]
        assert point["values"] == {"loss": metrics["loss"], "model_size": metrics["model_size"]}
        assert point["parameters"] == params[point["trial"]]
    assert status["hypervolume"]["value"] > 0 and status["hypervolume"]["history"]
    assert "bestTrial" not in status


def test_example_runs_with_kubetune_run_and_its_front_is_plotted_from_the_results_store(tmp_path):
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "RAY_USAGE_STATS_ENABLED": "0",
           "KUBETUNE_RESULTS_URL": f"sqlite:///{tmp_path / 'results.db'}"}
    completed = subprocess.run([sys.executable, "-m", "kubetune", "run", str(REPO / "examples" / "multi-objective.yaml"),
                                "--output", "json"], capture_output=True, text=True, timeout=300, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads(completed.stdout)
    finished = {t["name"]: t["lastMetrics"] for t in summary["trials"] if t["phase"] == "Succeeded"}
    check_front(summary["status"], finished, {t["name"]: t["parameters"] for t in summary["trials"]})
    for trial in summary["trials"]:
        if trial["phase"] == "Succeeded":
            assert ("infeasible" in trial) == (trial["lastMetrics"]["memory_gb"] > MEMORY_MAX)

    # issue 19 item 5: the front and the hypervolume history, drawn from the results store
    plotted = subprocess.run([sys.executable, "-m", "kubetune", "results", "multi-objective", "-n", "local",
                              "--plot", str(tmp_path / "plots"), "--objectives", "loss:min:2.0,model_size:min:1.0",
                              "--constraints", f"memory_gb:max:{MEMORY_MAX}", "-o", "csv"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    assert {"pareto.png", "hypervolume.png"} <= {p.name for p in (tmp_path / "plots").iterdir()}
    [line] = [line for line in plotted.stderr.splitlines() if line.startswith("Pareto front:")]
    assert set(line.split(": ", 2)[2].split(", ")) == expected_front(finished)


def test_example_through_the_operator_with_a_restart_then_a_warm_start(operator, experiments_api, namespace):
    body = copy.deepcopy(EXAMPLE)
    body["spec"]["budget"]["maxTrials"] = 14
    create(experiments_api, namespace, body)
    name = body["metadata"]["name"]

    def finished_count():
        return sum(t.get("status", {}).get("phase") in ("Succeeded", "Stopped")
                   for t in trials(experiments_api, namespace, name))
    wait_for(lambda: finished_count() >= 4, timeout=120, interval=0.2, message="4 trials finished")
    operator.kill()
    operator.start()
    done = wait_condition(experiments_api, namespace, name, "Succeeded", timeout=240, operator=operator)

    items = trials(experiments_api, namespace, name)
    assert [t["metadata"]["name"] for t in items] == [f"{name}-{i}" for i in range(14)]
    assert items[0]["spec"]["parameters"] == EXAMPLE["spec"]["search"]["initialPoints"][0]
    finished = {t["metadata"]["name"]: t["status"]["lastMetrics"] for t in items if t["status"]["phase"] == "Succeeded"}
    check_front(done["status"], finished, {t["metadata"]["name"]: t["spec"]["parameters"] for t in items})
    for trial in items:
        status = trial["status"]
        # nothing ran twice across the restart
        assert status["attempt"] == 0
        if status["phase"] == "Stopped":
            assert status["reason"] == "EarlyStopped" and "non-dominated rank" in status["message"]
        if status["phase"] == "Succeeded":
            assert ("infeasible" in status) == (status["lastMetrics"]["memory_gb"] > MEMORY_MAX)
    assert any(t["status"]["phase"] == "Stopped" for t in items), "MO-ASHA stopped no trial"

    # kubectl get: the FRONT column
    table = experiments_api.api_client.call_api(
        *experiments_api.api_client.param_serialize(
            "GET", f"/apis/kubetune.dev/v1alpha1/namespaces/{namespace}/experiments/{name}",
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, auth_settings=["BearerToken"]))
    table.read()
    data = json.loads(table.data)
    column = [c["name"] for c in data["columnDefinitions"]].index("Front")
    assert data["rows"][0]["cells"][column] == done["status"]["paretoFront"]["size"]

    # A second Experiment seeded by the first, searching the bounding box of the first's
    # feasible front: its first point (a configuration the first one completed) is reused,
    # not run; an Experiment that does not exist is reported.
    source = next(t for t in items if t["status"]["phase"] == "Succeeded")
    warm = copy.deepcopy(EXAMPLE)
    warm["metadata"]["name"] = "warm"
    warm["spec"]["budget"]["maxTrials"] = 3
    warm["spec"]["search"]["initialPoints"] = [source["spec"]["parameters"]]
    warm["spec"]["warmStart"] = {"experiments": [name, "never-was"], "searchSpace": "boundingBox"}
    create(experiments_api, namespace, warm)
    done = wait_condition(experiments_api, namespace, "warm", "Succeeded", timeout=180, operator=operator)
    seeded = condition(done, "WarmStarted")
    assert seeded["status"] == "True" and "never-was" in seeded["message"]
    params = {t["metadata"]["name"]: t["spec"]["parameters"] for t in items}
    spanning = [params[n] for n in expected_front(finished)] + [source["spec"]["parameters"]]
    low = {p: min(s[p] for s in spanning) for p in ("lr", "depth")}
    high = {p: max(s[p] for s in spanning) for p in ("lr", "depth")}
    widths = {s["width"] for s in spanning}

    def in_box(p):
        return all(low[k] <= p[k] <= high[k] for k in low) and p["width"] in widths
    inside = [n for n in finished if in_box(params[n])]
    assert f"{len(inside)} completed trials" in seeded["message"]
    assert f"bounding box of the best {len(expected_front(finished))} earlier trials" in seeded["message"]
    assert all(in_box(t["spec"]["parameters"]) for t in trials(experiments_api, namespace, "warm"))
    reused = done["status"]["reusedTrials"]
    source_name = source["metadata"]["name"]
    assert reused["count"] >= 1 and reused["trials"][0] == {"trial": "warm-0", "source": f"{name}/{source_name}"}
    first = trials(experiments_api, namespace, "warm")[0]["status"]
    assert first["phase"] == "Succeeded" and first["reason"] == "Reused" and "startTime" not in first
    assert first["lastMetrics"]["loss"] == finished[source_name]["loss"]
    assert done["status"]["trialCounts"]["created"] == 3
