"""Ray unavailable (issue 5): the Ray head stops mid-experiment and comes back at the
same address.  The Experiment says so (condition RayUnavailable, naming the address
and the error) while the operator keeps running and retrying, and completes once Ray
is back: the trials lost with the old cluster are relaunched from their checkpoints,
as cluster faults that do not count against maxFailures."""
from __future__ import annotations

import pytest

from autoscaler_fixtures import RayHead, free_port
from k8s_helpers import condition, create, experiment, trials, wait_condition
from kube_fixtures import wait_for
from operator_fixtures import OperatorProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def ray_head():
    """A small Ray head (no autoscaler) the test may stop and start again at its address."""
    head = RayHead(autoscaling=False, num_cpus=2).start()
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture
def operator_on_head(kube_cluster, ray_head, namespace, tmp_path):
    process = OperatorProcess(kube_cluster.kubeconfig, ray_head.address, tmp_path, namespace,
                              extra_args=("--ingest-port", str(free_port()))).start()
    yield process
    process.stop_and_report()


def test_ray_stopped_mid_experiment_is_reported_and_the_experiment_completes_when_back(
        operator_on_head, ray_head, experiments_api, namespace):
    api, ns, operator = experiments_api, namespace, operator_on_head
    iterations = 25
    create(api, ns, experiment(
        "outage", entrypoint="kubetune.examples.sleepy:train", objective={"metric": "step", "mode": "max"},
        budget={"maxTrials": 2, "parallelism": 2},
        trial={"resources": {"cpu": 0.5}, "maxFailures": 0,
               "config": {"iterations": iterations, "interval": 0.2, "checkpoint_every": 3}}))

    def progressed(least: int) -> bool:
        items = trials(api, ns, "outage")
        return len(items) == 2 and all((t.get("status") or {}).get("phase") == "Running"
                                       and (t["status"].get("iteration") or 0) >= least for t in items)
    wait_for(lambda: progressed(4), timeout=120, interval=0.2, message="both trials past their first checkpoint")

    ray_head.stop(remove_files=False)
    down = wait_condition(api, ns, "outage", "RayUnavailable", timeout=60, operator=operator)
    unavailable = condition(down, "RayUnavailable")
    assert unavailable["reason"] == "ConnectionFailed"
    assert ray_head.address in unavailable["message"], unavailable["message"]
    assert "refused" in unavailable["message"] or "unreachable" in unavailable["message"], unavailable["message"]
    assert down["status"]["phase"] == "Running"
    # a lost connection fails no trial, and the operator does not crash (nor loop)
    assert [(t.get("status") or {}).get("phase") for t in trials(api, ns, "outage")] == ["Running"] * 2
    ray_head.start()

    done = wait_condition(api, ns, "outage", "Succeeded", timeout=150, operator=operator)
    assert operator.process.poll() is None and operator.starts == 1
    assert condition(done, "RayUnavailable")["status"] == "False"
    assert condition(done, "RayUnavailable")["reason"] == "Connected"
    for trial in trials(api, ns, "outage"):
        status = trial["status"]
        assert status["phase"] == "Succeeded" and status["iteration"] == iterations, status
        # relaunched after the restart, without spending maxFailures (0)
        assert status["attempt"] >= 1, status
        assert [f["reason"] for f in status["failures"]] == ["ClusterFault"] * status["attempt"], status
    assert done["status"]["trialCounts"]["failed"] == 0
