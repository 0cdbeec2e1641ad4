"""Search and early stopping through the operator: an ASHA Experiment on the real
API server and Ray, whose Trials say why they were stopped."""
from __future__ import annotations

import pytest

from k8s_helpers import condition, create, experiment, trials, wait_condition

pytestmark = pytest.mark.integration


def test_asha_stops_weak_trials_and_says_why(operator, experiments_api, namespace):
    body = experiment(
        "asha", search={"algorithm": "random", "seed": 3},
        scheduler={"type": "asha", "maxIterations": 9, "gracePeriod": 1, "reductionFactor": 3},
        budget={"maxTrials": 9, "parallelism": 3},
        trial={"config": {"iterations": 9, "delay": 0.05}})
    create(experiments_api, namespace, body)
    done = wait_condition(experiments_api, namespace, "asha", "Succeeded", timeout=180, operator=operator)

    items = trials(experiments_api, namespace, "asha")
    assert len(items) == 9
    stopped = [t for t in items if t["status"]["phase"] == "Stopped"]
    assert stopped, "ASHA stopped no trial"
    for trial in stopped:
        assert trial["status"]["reason"] == "EarlyStopped"
        assert "below rung" in trial["status"]["message"] and "cutoff" in trial["status"]["message"]
        assert trial["status"]["iteration"] < 9
    finished = [t for t in items if t["status"]["phase"] == "Succeeded"]
    assert all(t["status"]["iteration"] == 9 for t in finished)
    # early stopping spent fewer iterations than running every trial to the end
    assert sum(t["status"]["iteration"] for t in items) < 9 * 9
    best = min(items, key=lambda t: t["status"]["bestMetric"])
    assert done["status"]["bestTrial"]["name"] == best["metadata"]["name"]
    assert condition(done, "Succeeded")["reason"] == "MaxTrialsReached"
