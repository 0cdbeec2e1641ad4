"""Deleting an Experiment ends its trials (issue 15): also when it was deleted while
no operator ran, and, when no operator ever comes back, the trials end themselves once
their lease runs out."""
from __future__ import annotations

import pytest

from k8s_helpers import GROUP, VERSION, create, experiment, experiment_gone, trials
from kube_fixtures import wait_for
from lifecycle_helpers import alive
from recovery_fixtures import OperatorWithEnv

pytestmark = pytest.mark.integration

RESUMABLE = "kubetune.examples.resumable:train"


def long_running(name: str) -> dict:
    # five minutes of work: far longer than the tests wait for its end
    return experiment(name, entrypoint=RESUMABLE, objective={"metric": "loss", "mode": "min"},
                      search_space={"lr": {"choice": [0.1, 0.2]}}, search={"algorithm": "grid"},
                      budget={"maxTrials": 2, "parallelism": 2},
                      trial={"config": {"iterations": 3000, "interval": 0.1}})


def running_pids(api, namespace: str, name: str) -> set[int]:
    """The processes of the experiment's trials, once both have reported."""
    items = trials(api, namespace, name)
    pids = {t["status"]["history"][-1]["pid"] for t in items if (t.get("status") or {}).get("history")}
    return pids if len(pids) == 2 else set()


def test_deleted_while_the_operator_was_down(operator, experiments_api, namespace):
    create(experiments_api, namespace, long_running("gone"))
    pids = wait_for(lambda: running_pids(experiments_api, namespace, "gone"), timeout=180,
                    message="both trials running")
    operator.kill()
    experiments_api.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "gone")
    operator.start()
    wait_for(lambda: experiment_gone(experiments_api, namespace, "gone"), timeout=180,
             message="the Experiment's finalizer released")
    # the finalizer went once Ray had the trials' actors dead (the platform's end_all: none
    # left); their processes exit right behind that, not at once (Ray marks an actor dead,
    # then its worker exits): seen alive a few milliseconds after, on a loaded machine
    wait_for(lambda: not [pid for pid in pids if alive(pid)], timeout=30, interval=0.05,
             message="the trials' processes ended")


def test_trials_end_themselves_when_their_operator_is_gone(kube_cluster, ray_local, experiments_api, namespace,
                                                           tmp_path):
    operator = OperatorWithEnv(kube_cluster.kubeconfig, ray_local, tmp_path, namespace,
                               extra_args=("--trial-lease-seconds", "4"), env={}).start()
    try:
        create(experiments_api, namespace, long_running("lost"))
        pids = wait_for(lambda: running_pids(experiments_api, namespace, "lost"), timeout=180,
                        message="both trials running")
        # the operator is gone for good, and someone forces the Experiment away
        operator.kill()
        experiments_api.patch_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "lost",
                                                       {"metadata": {"finalizers": None}})
        experiments_api.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "lost")
        wait_for(lambda: not [pid for pid in pids if alive(pid)], timeout=90,
                 message="the trials to end after their 4 s lease")
    finally:
        operator.stop()
