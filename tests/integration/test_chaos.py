"""Chaos (issue 15): SIGKILL the operator at 15 points (``make soak``; 6 in ``make test``,
soak.py) of a 30-trial ASHA Experiment with checkpoints, retries and one injected trial
failure; then the same with two replicas, killing whichever leads. The run must end as
if nothing happened: exactly 30 Trials, 30 distinct configurations, every history
gap-free and duplicate-free, the failed trial resumed from its checkpoint, no trial
restarted by a kill other than from its checkpoint, and no Ray actor left behind.

The kill points come from a fixed seed (reproducible in CI): the operator is killed
once the Trials record that many iterations in all and it has lived a drawn while
(so it dies restoring, re-attaching, fetching, launching or writing). Every trial
reports at least once before the Experiment can finish, so a point below 30 is
always mid-run."""
from __future__ import annotations

import random
import time
from typing import Callable

import pytest

from k8s_helpers import condition, create, experiment, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.examples.resumable import expected_losses
from lifecycle_helpers import Replica, lease_holder, named_actors
from soak import size, soak
from test_recovery import LOSS, RESUMABLE, column

pytestmark = pytest.mark.integration

SEED = 15
KILLS = size(quick=6, full=15)
COUNT, ITERATIONS = 30, 9
# every lr at most 0.81: that one is then the best at ASHA's rungs 1 and 3, so it is
# never stopped early and always gets to fail after iteration 4, whatever the order
LRS = [round(0.027 * i, 3) for i in range(1, COUNT + 1)]
FAIL_LR, FAIL_AT = 0.81, 4


def chaos_experiment(name: str) -> dict:
    return experiment(name, entrypoint=RESUMABLE, objective=LOSS, search_space={"lr": {"choice": LRS}},
                      search={"algorithm": "grid", "seed": SEED},
                      scheduler={"type": "asha", "maxIterations": ITERATIONS, "gracePeriod": 1,
                                 "reductionFactor": 3},
                      budget={"maxTrials": COUNT, "parallelism": 3},
                      trial={"maxFailures": 1, "config": {"iterations": ITERATIONS, "interval": 0.3,
                                                          "fail_at": FAIL_AT, "fail_lr": FAIL_LR}})


def recorded(api, namespace: str, name: str) -> int:
    return sum(len((t.get("status") or {}).get("history") or ()) for t in trials(api, namespace, name))


def finished(api, namespace: str, name: str) -> bool:
    return (get_experiment(api, namespace, name).get("status") or {}).get("phase") in ("Succeeded", "Failed")


def kill_on_schedule(api, namespace: str, name: str, kill_and_restart: Callable[[], None]) -> int:
    """Kill at the seeded points; returns how many kills hit the run while it was unfinished."""
    rng = random.Random(SEED)
    points = sorted(rng.sample(range(1, COUNT - 1), KILLS))
    lifetimes = [rng.uniform(0.3, 2.0) for _ in points]
    mid_run = 0
    for point, lifetime in zip(points, lifetimes):
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started >= lifetime and recorded(api, namespace, name) >= point,
                 timeout=120, interval=0.05, message=f"{point} iterations recorded")
        mid_run += not finished(api, namespace, name)
        kill_and_restart()
    return mid_run


def assert_as_if_nothing_happened(api, namespace: str, name: str, ray_address: str) -> None:
    done = wait_condition(api, namespace, name, "Succeeded", timeout=300)
    assert condition(done, "Succeeded")["reason"] == "MaxTrialsReached"
    items = trials(api, namespace, name)
    assert [t["metadata"]["name"] for t in items] == [f"{name}-{i}" for i in range(COUNT)]
    assert sorted(t["spec"]["parameters"]["lr"] for t in items) == LRS          # no configuration twice
    for trial in items:
        lr, status = trial["spec"]["parameters"]["lr"], trial["status"]
        steps = column(trial, "iteration")
        assert steps == list(range(1, len(steps) + 1)), trial["metadata"]["name"]     # no gap, no duplicate
        assert column(trial, "loss") == pytest.approx(expected_losses(lr, len(steps)), rel=1e-12)
        # a kill can catch a launch half done (the actor never registered): that trial is
        # relaunched from its checkpoint as a cluster fault, its history still gap-free
        faults = [(f["attempt"], f["reason"]) for f in status.get("failures") or ()]
        attempts = column(trial, "attempt")
        if lr == FAIL_LR:
            # failed after iteration 4 and resumed from its checkpoint there: a later attempt
            # goes on at 5 with the loss the checkpointed state leads to (from scratch it
            # would report iteration 1 again)
            assert status["phase"] == "Succeeded" and steps[-1] == ITERATIONS
            assert attempts[:FAIL_AT] == [0] * FAIL_AT and attempts[FAIL_AT] >= 1
            assert faults[0] == (0, "Error") and {reason for _, reason in faults[1:]} <= {"ClusterFault"}
        else:
            assert status["phase"] in ("Succeeded", "Stopped"), status.get("message")
            assert {reason for _, reason in faults} <= {"ClusterFault"}, faults
        assert attempts == sorted(attempts)                   # each attempt once, in order
    assert any(t["status"]["reason"] == "EarlyStopped" for t in items)           # ASHA did stop some
    wait_for(lambda: named_actors(ray_address, f"{namespace}/{name}/") == [], timeout=60,
             message="no Ray actor of the experiment left")


@soak
def test_operator_killed_again_and_again_during_an_asha_run(operator, ray_local, experiments_api, namespace):
    create(experiments_api, namespace, chaos_experiment("chaos"))

    def kill_and_restart() -> None:
        operator.kill()
        operator.start()

    try:
        assert kill_on_schedule(experiments_api, namespace, "chaos", kill_and_restart) == KILLS
        assert_as_if_nothing_happened(experiments_api, namespace, "chaos", ray_local)
    except BaseException:
        print(operator.log()[-8000:])
        raise
    assert operator.starts == KILLS + 1


@soak
def test_leader_killed_again_and_again_during_an_asha_run(kube_cluster, ray_local, experiments_api, namespace,
                                                         tmp_path):
    # a 4 s Lease (the chart's is 8 s: test_leader_election) keeps the failovers within CI's budget
    replicas = {name: Replica(kube_cluster, ray_local, tmp_path, namespace, name,
                              extra_args=("--lease-duration-seconds", "4")).start() for name in ("a", "b")}
    create(experiments_api, namespace, chaos_experiment("ha"))

    def kill_the_leader_and_restart_it() -> None:
        for replica in replicas.values():    # one that exited (a lost Lease) comes back, as a kubelet does
            if replica.process.poll() is not None:
                replica.start()
        # whoever leads now (after a failover, once the standby took the Lease)
        leader = wait_for(lambda: (r := replicas.get(lease_holder(kube_cluster, namespace))) is not None
                          and r.status("/readyz") == 200 and r, timeout=60, interval=0.05,
                          message="a live leader")
        leader.kill()
        leader.start()      # back as the standby

    try:
        assert kill_on_schedule(experiments_api, namespace, "ha", kill_the_leader_and_restart_it) == KILLS
        assert_as_if_nothing_happened(experiments_api, namespace, "ha", ray_local)
    except BaseException:
        for replica in replicas.values():
            print(f"--- replica {replica.identity}\n{replica.log()[-4000:]}")
        raise
    finally:
        for replica in replicas.values():
            replica.stop_and_report()
    assert sum(r.starts for r in replicas.values()) >= KILLS + 2
