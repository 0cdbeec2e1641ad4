"""A PBT exploit never points at a checkpoint the donor's retention may delete.

Pod trials (pod_fixtures: kube-scheduler + kwok; the test plays the containers, so it
decides exactly when each checkpoint is written).  The donor keeps one checkpoint
(``keepLast: 1``): its next report deletes the one the recipient was given, before the
recipient's new pod gets to restore it — and across an operator restart too.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from k8s_helpers import GROUP, VERSION, create, trials
from kube_fixtures import wait_for
from test_pods import Container, pod_experiment, pods_of

pytestmark = pytest.mark.integration


def pbt_experiment(name: str) -> dict:
    return pod_experiment(
        name, budget={"maxTrials": 2, "parallelism": 2}, trial={"resources": {"cpu": 0.1}},
        search_space={"lr": {"choice": [0.1, 0.2, 0.3]}},
        scheduler={"type": "pbt", "perturbationInterval": 1, "quantileFraction": 0.5, "resampleProbability": 0.0,
                   "maxIterations": 4},
        checkpoint={"keepLast": 1})


def save(directory: Path, text: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.txt").write_text(text)
    return str(directory)


def running_pods(core, ns: str, experiment: str, count: int) -> list:
    return wait_for(lambda: (lambda ps: ps if len(ps) == count else None)(
        [p for p in pods_of(core, ns, experiment) if p.status.phase == "Running"]),
        timeout=60, interval=0.2, message=f"{count} running pods of {experiment}")


def history_length(custom, ns: str, trial: str) -> int:
    status = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trials", trial).get("status") or {}
    return len(status.get("history") or [])


def exploit(core, custom, ns: str, experiment: str, tmp_path: Path) -> tuple[Container, Container, str]:
    """Both trials report iteration 1 with a checkpoint, the donor first and better: the
    other one is paused and relaunched from the donor's checkpoint.  Returns (donor,
    recipient's new container, recipient's trial name)."""
    first, second = sorted((Container(core, p, tmp_path) for p in running_pods(core, ns, experiment, 2)),
                           key=lambda c: c.trial)
    donor, recipient = first, second
    donor.session.report({"loss": 0.1}, checkpoint=save(tmp_path / "donor-1", "donor at 1"))
    wait_for(lambda: history_length(custom, ns, donor.trial) == 1, timeout=30, interval=0.2,
             message="the donor's first result recorded")
    recipient.session.report({"loss": 0.9}, checkpoint=save(tmp_path / "recipient-1", "recipient at 1"))
    relaunched = wait_for(lambda: next((p for p in pods_of(core, ns, experiment)
                                        if p.metadata.name == f"{recipient.trial}-a1" and p.status.phase == "Running"),
                                       None), timeout=60, interval=0.2, message="the exploiting trial's new pod")
    trial = custom.get_namespaced_custom_object(GROUP, VERSION, ns, "trials", recipient.trial)
    assert trial["status"]["lineage"][0]["from"] == donor.trial
    return donor, relaunched, recipient.trial


def test_an_exploit_restores_the_donor_checkpoint_after_the_donor_moved_on(pod_operator, gpu_cluster, pod_namespace,
                                                                            tmp_path):
    from kubernetes import client
    ns = pod_namespace
    with gpu_cluster.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        create(custom, ns, pbt_experiment("clone"))
        donor, relaunched, recipient = exploit(core, custom, ns, "clone", tmp_path)
        # the donor moves on before the recipient's new pod restores: keepLast 1 deletes
        # the donor's checkpoint of iteration 1
        donor.session.report({"loss": 0.05}, checkpoint=save(tmp_path / "donor-2", "donor at 2"))
        restored = Container(core, relaunched, tmp_path)
        assert restored.env["KUBETUNE_START_ITERATION"] == "1"
        assert (Path(restored.session.get_checkpoint()) / "model.txt").read_text() == "donor at 1"


def test_an_exploit_survives_an_operator_restart_before_the_recipient_restores(pod_operator, gpu_cluster,
                                                                                pod_namespace, tmp_path):
    from kubernetes import client
    ns = pod_namespace
    with gpu_cluster.api_client() as api:
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        create(custom, ns, pbt_experiment("restart"))
        donor, relaunched, recipient = exploit(core, custom, ns, "restart", tmp_path)
        pod_operator.kill()
        pod_operator.start()
        # the donor's report waits for the restarted operator's endpoint (it retries)
        donor.session.report({"loss": 0.05}, checkpoint=save(tmp_path / "donor-2", "donor at 2"))
        donor.session.report({"loss": 0.04}, checkpoint=save(tmp_path / "donor-3", "donor at 3"))
        wait_for(lambda: history_length(custom, ns, donor.trial) == 3, timeout=60, interval=0.2,
                 message="the donor's results recorded by the restarted operator")
        restored = Container(core, relaunched, tmp_path)
        assert (Path(restored.session.get_checkpoint()) / "model.txt").read_text() == "donor at 1"
        # the recipient goes on from there, under the restarted operator
        restored.session.report({"loss": 0.2})
        wait_for(lambda: history_length(custom, ns, recipient) >= 2, timeout=30, interval=0.2,
                 message="the recipient's result after the restart")
        [trial] = [t for t in trials(custom, ns, "restart") if t["metadata"]["name"] == recipient]
        assert trial["status"]["parent"] == donor.trial
