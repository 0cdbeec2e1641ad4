"""Ray unavailable (issue 5): the Ray head stops mid-experiment and comes back at the
same address.  The Experiment says so (condition RayUnavailable, naming the address
and the error) while the operator keeps running and retrying, and completes once Ray
is back: the trials lost with the old cluster are relaunched from their checkpoints,
as cluster faults that do not count against maxFailures."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autoscaler_fixtures import RayHead, free_port
from k8s_helpers import condition, create, experiment, trials, wait_condition
from kube_fixtures import wait_for
from operator_fixtures import OperatorProcess

pytestmark = pytest.mark.integration

# The operator's own Ray driver, made as the operator makes it, with a read of Ray's
# internal KV (where every trial's answer is read, executors/ray/answers.py) always in
# flight; it says what that read returned, and lives on.
DRIVER_READING_THE_KV = """
import sys, time
from ray.experimental import internal_kv
from kubetune.executors.ray.executor import RayExecutor
RayExecutor(sys.argv[1]).connect()
print("connected", flush=True)
while True:
    try:
        internal_kv._internal_kv_get(b"any", namespace=b"kubetune-test")
    except Exception as error:   # the one in flight as the GCS ends may be cancelled at once
        print("a read returned:", type(error).__name__, error, flush=True)
        if "WrongClusterID" in str(error):
            break
    time.sleep(0.05)   # once the head is gone, the next read waits for a GCS
while True:
    time.sleep(1)
"""


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


def test_a_gcs_read_in_flight_when_the_head_stops_does_not_end_the_driver(ray_head, tmp_path):
    """The GCS client behind Ray's internal KV kept the reconnect timeout the process
    started with (here 2 s; Ray's default is 60 s), not the one the operator sets before
    ray.init (liveness.prepare_driver_env): a read in flight when the head stopped ended
    the whole process that long after ("Failed to connect to GCS within 604800 seconds")."""
    output = tmp_path / "driver.out"
    env = {**os.environ, "RAY_gcs_rpc_server_reconnect_timeout_s": "2"}
    with output.open("w") as sink:
        driver = subprocess.Popen([sys.executable, "-c", DRIVER_READING_THE_KV, ray_head.address],
                                  stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: "connected" in output.read_text() or driver.poll() is not None, timeout=120,
                 message="the driver to connect")
        assert driver.poll() is None, output.read_text()
        ray_head.stop(remove_files=False)
        ray_head.start()
        # a read waits for a GCS at the address; the new cluster refuses it, by its id
        wait_for(lambda: "WrongClusterID" in output.read_text() or driver.poll() is not None, timeout=120,
                 message="a read waiting out the outage to return once a head answers again")
        assert driver.poll() is None, output.read_text()[-3000:]
        assert "WrongClusterID" in output.read_text(), output.read_text()[-3000:]
    finally:
        driver.kill()
        driver.wait(10)
