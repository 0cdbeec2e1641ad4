"""Several Ray clusters from one operator (issue 15, item 6): each Ray address an
Experiment names gets a connection of its own (the operator's own address in its
process, any other in a driver process of its own), and an address that cannot be
reached fails only the Experiments that name it.

Before, the operator held one Ray connection: an Experiment naming a second cluster
was refused, and after a restart whichever daemon started first could decide the
connection for everyone."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from k8s_helpers import condition, create, experiment, experiment_gone, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.devcluster.processes import free_port
from ray_fixtures import start_ray_head, stop_ray_head

pytestmark = pytest.mark.integration

SECOND = "second_head"   # a resource only the second head has: a trial placed elsewhere is Infeasible


@pytest.fixture
def second_head():
    """Another Ray cluster, named as Experiments name one: by its Ray Client address."""
    client_port = free_port()
    process, _, temp_dir = start_ray_head(num_cpus=2, num_gpus=0, resources={SECOND: 4}, client_port=client_port)
    try:
        yield f"ray://127.0.0.1:{client_port}"
    finally:
        stop_ray_head(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_experiments_on_two_ray_clusters_run_and_a_bad_address_fails_alone(
        operator, second_head, experiments_api, namespace, tmp_path):
    api, ns = experiments_api, namespace
    bad = f"ray://127.0.0.1:{free_port()}"      # nothing listens there
    gate = tmp_path / "gate"
    # the bad address comes first: before, its daemon could claim the one Ray connection
    create(api, ns, experiment("typo", ray={"address": bad}, budget={"maxTrials": 1}))
    create(api, ns, experiment(
        "elsewhere", entrypoint="kubetune.examples.sleepy:train", objective={"metric": "step", "mode": "max"},
        ray={"address": second_head}, budget={"maxTrials": 2, "parallelism": 2},
        trial={"resources": {"cpu": 0.5, "custom": {SECOND: 1}},
               "config": {"iterations": 4, "interval": 0.01, "hold_after": 2, "gate": str(gate)}}))
    create(api, ns, experiment("here", budget={"maxTrials": 2}, trial={"config": {"iterations": 3}}))

    wait_condition(api, ns, "here", "Succeeded", timeout=240, operator=operator)

    def held(name: str) -> bool:
        items = trials(api, ns, name)
        return len(items) == 2 and all((t.get("status") or {}).get("phase") == "Running"
                                       and (t["status"].get("iteration") or 0) >= 2 for t in items)
    wait_for(lambda: held("elsewhere"), timeout=240, interval=0.5,
             message="both trials on the second cluster running, held at their gate")

    def refused_alone() -> None:
        typo = wait_condition(api, ns, "typo", "RayUnavailable", timeout=120, operator=operator)
        unavailable = condition(typo, "RayUnavailable")
        assert unavailable["reason"] == "ConnectionFailed" and bad in unavailable["message"], unavailable
        assert typo["status"].get("phase") != "Succeeded" and trials(api, ns, "typo") == []
        assert get_experiment(api, ns, "elsewhere")["status"]["phase"] == "Running"
    refused_alone()

    # after a restart every daemon starts at once: none decides the others' cluster
    operator.kill()
    operator.start()
    refused_alone()
    gate.touch()
    done = wait_condition(api, ns, "elsewhere", "Succeeded", timeout=240, operator=operator)
    assert done["status"]["trialCounts"]["succeeded"] == 2
    for trial in trials(api, ns, "elsewhere"):
        # re-attached after the restart on the second cluster, not started again
        assert trial["status"]["iteration"] == 4 and trial["status"]["attempt"] == 0, trial["status"]
    assert get_experiment(api, ns, "here")["status"]["phase"] == "Succeeded"

    # nothing ever ran at the bad address: its deletion is not held up waiting for it
    api.delete_namespaced_custom_object("kubetune.dev", "v1alpha1", ns, "experiments", "typo")
    wait_for(lambda: experiment_gone(api, ns, "typo"), timeout=60, interval=0.5, message="typo deleted")


def test_a_driver_process_that_dies_is_replaced_at_the_next_connect_and_dies_with_its_operator(ray_local, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from kubetune.executors.base import RayUnavailableError
    from kubetune.executors.ray.process import DriverProcess

    driver = DriverProcess(ray_local)
    try:
        driver.connect()
        assert driver.list_trials("it/none/") == []
        first = driver.pid
        os.kill(first, signal.SIGKILL)          # e.g. Ray aborted the driver's process
        with pytest.raises(RayUnavailableError, match="driver process") as failed:
            driver.list_trials("it/none/")
        assert failed.value.address == ray_local
        driver.connect()
        assert driver.pid not in (None, first) and driver.list_trials("it/none/") == []
    finally:
        driver.close()

    # an operator killed outright leaves no driver process behind
    script = tmp_path / "killed_operator.py"
    script.write_text("import os, signal, sys\n"
                      "from kubetune.executors.ray.process import DriverProcess\n"
                      f"driver = DriverProcess({ray_local!r})\ndriver.connect()\n"
                      "print(driver.pid, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert done.stdout.strip(), done.stderr[-3000:]
    orphan = int(done.stdout.split()[-1])

    def gone() -> bool:   # exited (a zombie not yet reaped by whoever adopted it counts)
        try:
            return (Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[0]) in ("Z", "X")
        except FileNotFoundError:
            return True
    wait_for(gone, timeout=60, interval=0.2, message="the driver process of a killed operator exiting")
