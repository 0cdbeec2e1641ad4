"""Nothing lost (issue 6): retries from checkpoints, a killed worker, an operator killed
ten times (four in ``make test``: soak.py), a Ray head restarted, checkpoint retention
and deletion, suspend and resume, PBT lineage.

Trials run ``kubetune.examples.resumable``: its losses are a pure function of the
learning rate and the iteration, so each test computes the history a Trial must show."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from k8s_helpers import create, experiment, get_experiment, trials, wait_condition
from kube_fixtures import wait_for
from kubetune.examples.resumable import expected_losses, step
from kubetune.results import open_store
from recovery_fixtures import OperatorWithEnv
from soak import size, soak

pytestmark = pytest.mark.integration

RESUMABLE = "kubetune.examples.resumable:train"
LOSS = {"metric": "loss", "mode": "min"}


def resumable(name: str, *, lr: float = 0.3, config: dict | None = None, **spec) -> dict:
    trial = {"config": {"interval": 0.02, **(config or {})}, **spec.pop("trial", {})}
    return experiment(name, entrypoint=RESUMABLE, objective=LOSS, search_space={"lr": {"choice": [lr]}},
                      search={"algorithm": "grid"}, trial=trial, **spec)


def only_trial(api, namespace: str, name: str) -> dict:
    items = trials(api, namespace, name)
    assert [t["metadata"]["name"] for t in items] == [f"{name}-0"]
    return items[0]


def first_status(api, namespace: str, name: str) -> dict:
    """The status of the experiment's first Trial; {} until it has one."""
    items = trials(api, namespace, name)
    return (items[0].get("status") or {}) if items else {}


def column(trial: dict, key: str) -> list:
    return [entry[key] for entry in trial["status"]["history"]]


def assert_history_is_the_functions(trial: dict, iterations: int) -> None:
    """One entry per iteration, 1..N, each the loss the function computes: no gap, no duplicate."""
    lr = trial["spec"]["parameters"]["lr"]
    assert column(trial, "iteration") == list(range(1, iterations + 1)), trial["metadata"]["name"]
    assert column(trial, "loss") == pytest.approx(expected_losses(lr, iterations), rel=1e-12)


def test_retries_resume_from_checkpoints_and_respect_max_failures(operator, experiments_api, namespace, tmp_path):
    gate = tmp_path / "gate"
    storage = tmp_path / "checkpoints" / namespace
    bodies = {
        # raises right after reporting iteration 5, which it checkpointed
        "raise": resumable("raise", config={"iterations": 8, "fail_at": 5},
                           trial={"maxFailures": 1}, checkpoint={"deleteOnCompletion": True}),
        # dies past its last checkpoint (3): the retry redoes 4 and 5
        "past": resumable("past", config={"iterations": 8, "fail_at": 5, "checkpoint_every": 3},
                          trial={"maxFailures": 1}, checkpoint={"deleteOnCompletion": True}),
        # fails on every attempt, with no checkpoint: three attempts, then Failed
        "always": resumable("always", config={"iterations": 8, "fail_at": 2, "fail_attempts": "all",
                                              "checkpoint_every": 0}, trial={"maxFailures": 2}),
        # its worker process is SIGKILLed while it waits after iteration 4
        "killed": resumable("killed", config={"iterations": 8, "hold_at": 4, "gate": str(gate)},
                            trial={"maxFailures": 1}),
    }
    for body in bodies.values():
        create(experiments_api, namespace, body)

    def held_trial():
        status = first_status(experiments_api, namespace, "killed")
        return status if status.get("iteration") == 4 and len(status.get("history") or ()) == 4 else None
    held = wait_for(held_trial, timeout=60, message="the trial to wait after iteration 4")
    victim = held["history"][-1]["pid"]
    os.kill(victim, signal.SIGKILL)
    gate.touch()

    for name in bodies:
        wait_condition(experiments_api, namespace, name, "Succeeded" if name != "always" else "Failed",
                       timeout=90, operator=operator)

    raised = only_trial(experiments_api, namespace, "raise")
    assert raised["status"]["phase"] == "Succeeded"
    assert_history_is_the_functions(raised, 8)
    assert column(raised, "attempt") == [0] * 5 + [1] * 3          # the retry went on after 5
    assert raised["status"]["attempt"] == 1
    [failure] = raised["status"]["failures"]
    assert (failure["attempt"], failure["reason"]) == (0, "Error")
    assert failure["message"] == "RuntimeError: planned failure after iteration 5 (attempt 0)"
    assert raised["status"]["checkpoint"].endswith(f"{namespace}/raise/raise-0/checkpoint-000008")
    assert raised["status"]["checkpointIteration"] == 8

    past = only_trial(experiments_api, namespace, "past")
    assert_history_is_the_functions(past, 8)
    assert column(past, "attempt") == [0] * 3 + [1] * 5            # 4 and 5 redone, recorded once
    assert past["status"]["attempt"] == 1 and len(past["status"]["failures"]) == 1

    always = only_trial(experiments_api, namespace, "always")
    assert always["status"]["phase"] == "Failed" and always["status"]["reason"] == "Error"
    assert always["status"]["attempt"] == 2                          # maxFailures 2: three attempts
    assert [(f["attempt"], f["reason"], f["message"]) for f in always["status"]["failures"]] == [
        (n, "Error", f"RuntimeError: planned failure after iteration 2 (attempt {n})") for n in range(3)]
    assert "Traceback" in always["status"]["message"]
    assert_history_is_the_functions(always, 2)                       # the last attempt's, from scratch
    assert column(always, "attempt") == [2, 2]
    assert get_experiment(experiments_api, namespace, "always")["status"]["trialCounts"]["failed"] == 1

    killed = only_trial(experiments_api, namespace, "killed")
    assert killed["status"]["phase"] == "Succeeded"
    assert_history_is_the_functions(killed, 8)
    assert column(killed, "attempt") == [0] * 4 + [1] * 4           # resumed from its checkpoint at 4
    pids = column(killed, "pid")
    assert set(pids[:4]) == {victim} and victim not in pids[4:]
    [failure] = killed["status"]["failures"]
    assert failure["reason"] == "Error" and "died" in failure["message"]

    # deleteOnCompletion removes a finished trial's checkpoints; without it they stay (keepLast 2)
    for name in ("raise", "past"):
        wait_for(lambda: not (storage / name).exists() or not any((storage / name).rglob("checkpoint-*")),
                 timeout=15, message=f"the checkpoints of {name} to be deleted")
    kept = storage / "killed" / "killed-0"
    assert sorted(os.listdir(kept)) == ["checkpoint-000007", "checkpoint-000008"]
    assert killed["status"]["checkpoint"] == str(kept / "checkpoint-000008")


def checkpointed_iterations(trial_dirs) -> int:
    """How far the trials' functions got (from their checkpoints on disk), whatever the operator saw."""
    total = 0
    for trial_dir in trial_dirs.iterdir() if trial_dirs.exists() else ():
        names = [n for n in os.listdir(trial_dir) if n.startswith("checkpoint-")]
        total += max((int(n.rsplit("-", 1)[1]) for n in names), default=0)
    return total


@soak
def test_operator_killed_again_and_again_loses_nothing_and_restarts_no_trial(operator, experiments_api, namespace,
                                                                             tmp_path):
    rng = random.Random(6)
    iterations, count = 10, 20
    kills = size(quick=4, full=10)
    body = experiment("chaos", entrypoint=RESUMABLE, objective=LOSS,
                      search_space={"lr": {"loguniform": [0.01, 0.9]}}, search={"algorithm": "random", "seed": 6},
                      budget={"maxTrials": count, "parallelism": 5},
                      trial={"config": {"iterations": iterations, "interval": 0.3}})
    create(experiments_api, namespace, body)
    trial_dirs = tmp_path / "checkpoints" / namespace / "chaos"

    # The schedule: SIGKILL the operator when the trials have done this many iterations in
    # all, once it has lived this long (so that it was killed doing something: restoring,
    # re-attaching, fetching, launching or writing status).
    points = sorted(rng.sample(range(5, count * iterations - 20), kills))
    lifetimes = [rng.uniform(0.3, 2.5) for _ in points]
    running_at_kill: set[str] = set()         # trials running when an operator died
    kills_mid_run = 0
    for point, lifetime in zip(points, lifetimes):
        started = time.monotonic()
        wait_for(lambda: checkpointed_iterations(trial_dirs) >= point and time.monotonic() - started >= lifetime,
                 timeout=60, interval=0.02, message=f"{point} iterations done")
        operator.kill()
        items = trials(experiments_api, namespace, "chaos")
        kills_mid_run += len(items) < count or any(t.get("status", {}).get("phase") != "Succeeded" for t in items)
        running_at_kill |= {t["metadata"]["name"] for t in items if t.get("status", {}).get("phase") == "Running"}
        operator.start()
    done = wait_condition(experiments_api, namespace, "chaos", "Succeeded", timeout=120, operator=operator)
    assert operator.starts == kills + 1 and kills_mid_run >= kills * 4 // 5

    items = trials(experiments_api, namespace, "chaos")
    assert [t["metadata"]["name"] for t in items] == [f"chaos-{i}" for i in range(count)]
    assert len({tuple(sorted(t["spec"]["parameters"].items())) for t in items}) == count
    for trial in items:
        assert trial["status"]["phase"] == "Succeeded"
        assert_history_is_the_functions(trial, iterations)
        # never restarted, also those running while an operator died: one attempt, one
        # process, no failure
        assert trial["status"]["attempt"] == 0 and not trial["status"].get("failures")
        assert set(column(trial, "attempt")) == {0}
        assert len(set(column(trial, "pid"))) == 1, trial["metadata"]["name"]
    assert len(running_at_kill) >= 8      # trials, not kills: the kill points fall in different waves
    assert done["status"]["trialCounts"]["succeeded"] == count

    # the results store holds every result once, whatever the kills (kubetune.results)
    uid = done["metadata"]["uid"]
    store = open_store(operator.results_url, create=False)
    try:
        wait_for(lambda: len(store.results(uid)) >= count * iterations, timeout=60, message="all results stored")
        stored = store.results(uid)
        names = {t.uid: t.name for t in store.trials(uid)}
        assert sorted(names.values()) == sorted(f"chaos-{i}" for i in range(count))
        for trial_uid in names:
            assert [r.iteration for r in stored if r.trial_uid == trial_uid] == list(range(1, iterations + 1))
    finally:
        store.close()


def test_ray_head_restart_relaunches_trials_from_checkpoints(kube_cluster, ray_restartable, experiments_api,
                                                              namespace, tmp_path):
    # Ray's own default would end the operator 3 s after it lost the GCS; the outage lasts longer
    operator = OperatorWithEnv(kube_cluster.kubeconfig, ray_restartable.address, tmp_path, namespace,
                               env={"RAY_gcs_rpc_server_reconnect_timeout_s": "3"}).start()
    try:
        iterations = 30
        body = experiment("phoenix", entrypoint=RESUMABLE, objective=LOSS,
                          search_space={"lr": {"choice": [0.05, 0.1, 0.2]}}, search={"algorithm": "grid"},
                          budget={"maxTrials": 3, "parallelism": 3},
                          trial={"maxFailures": 0, "config": {"iterations": iterations, "interval": 0.3,
                                                              "checkpoint_every": 2}})
        create(experiments_api, namespace, body)
        wait_for(lambda: sum(len((t.get("status") or {}).get("history") or ()) >= 4
                             for t in trials(experiments_api, namespace, "phoenix")) == 3,
                 timeout=60, message="three trials past iteration 4")
        stopped_at = time.monotonic()
        ray_restartable.stop()
        wait_condition(experiments_api, namespace, "phoenix", "RayUnavailable", timeout=30, operator=operator)
        ray_restartable.start()
        outage = time.monotonic() - stopped_at
        done = wait_condition(experiments_api, namespace, "phoenix", "Succeeded", timeout=120, operator=operator)
        assert outage > 3
        assert operator.process.poll() is None and operator.starts == 1, "the operator must outlive the outage"
    except BaseException:
        print(operator.log()[-8000:])
        raise
    finally:
        operator.stop()

    assert done["status"]["trialCounts"]["succeeded"] == 3
    for trial in trials(experiments_api, namespace, "phoenix"):
        status = trial["status"]
        assert status["phase"] == "Succeeded"
        assert_history_is_the_functions(trial, iterations)
        # relaunched after the restart as a retry that does not count against maxFailures (0)
        assert status["attempt"] >= 1 and {f["reason"] for f in status["failures"]} == {"ClusterFault"}
        attempts, pids = column(trial, "attempt"), column(trial, "pid")
        first_run = attempts.count(0)
        assert 4 <= first_run < iterations and len(set(pids[:first_run])) == 1
        assert not set(pids[:first_run]) & set(pids[first_run:])


def test_pbt_exploits_and_explores_with_lineage_on_the_trials(operator, experiments_api, namespace, tmp_path):
    iterations = 12
    gate = tmp_path / "gate"
    # PBT ranks a population that trains together, and its decision must reach a trial
    # before the trial ends. On a loaded machine the workers start seconds apart and the
    # operator can lag behind 12 fast iterations, so the trials wait twice: after
    # iteration 2 until all four have got there, and after iteration 3 until the first
    # exploit has happened. With lr 0.01 the loss stays above 8.8 for 12 iterations and
    # every other rate is below 7.1 from its first report: that trial is the bottom
    # quarter at iteration 3, and exploits whichever trial leads.
    body = experiment("pbt", entrypoint=RESUMABLE, objective=LOSS,
                      search_space={"lr": {"loguniform": [0.01, 0.9]}},
                      search={"algorithm": "random", "seed": 3,
                              "initialPoints": [{"lr": 0.3}, {"lr": 0.5}, {"lr": 0.7}, {"lr": 0.01}]},
                      scheduler={"type": "pbt", "maxIterations": iterations, "perturbationInterval": 3,
                                 "quantileFraction": 0.25, "resampleProbability": 0.0},
                      budget={"maxTrials": 4, "parallelism": 4},
                      trial={"config": {"iterations": iterations, "interval": 0.15,
                                        "hold_at": [2, 3], "gate": str(gate)}})
    create(experiments_api, namespace, body)

    def iterations_reached() -> list:
        return sorted((t.get("status") or {}).get("iteration") or 0 for t in trials(experiments_api, namespace, "pbt"))
    wait_for(lambda: iterations_reached() == [2] * 4, timeout=90, message="all four trials to wait after iteration 2")
    (tmp_path / "gate.2").touch()
    wait_for(lambda: any((t.get("status") or {}).get("lineage") for t in trials(experiments_api, namespace, "pbt")),
             timeout=90, message="the lr 0.01 trial to exploit the leader at iteration 3")
    (tmp_path / "gate.3").touch()
    wait_condition(experiments_api, namespace, "pbt", "Succeeded", timeout=90, operator=operator)
    items = {t["metadata"]["name"]: t for t in trials(experiments_api, namespace, "pbt")}
    exploited = [t for t in items.values() if t["status"].get("lineage")]
    assert exploited, "no trial exploited another"
    checked = 0
    for trial in items.values():
        status = trial["status"]
        assert status["phase"] == "Succeeded", (status.get("message"), status.get("failures"), status.get("lineage"))
        lineage = status.get("lineage") or []
        # one entry per iteration up to 12; it jumps ahead only where it took a donor's
        # checkpoint from further on (Ray Tune's PBT does the same)
        steps = column(trial, "iteration")
        assert steps[0] == 1 and steps[-1] == iterations
        assert all(b == a + 1 or b > a and b - 1 in {e["iteration"] for e in lineage} for a, b in zip(steps, steps[1:]))
        if not lineage:
            assert set(column(trial, "attempt")) == {0} and "parent" not in status
            continue
        last = lineage[-1]
        assert status["parent"] == last["from"] != trial["metadata"]["name"]
        assert status["attempt"] >= len(lineage)
        # after its last exploit it ran with the explored rate, from the donor's state
        k, lr = last["iteration"], last["params"]["lr"]
        after = [h for h in status["history"] if h["iteration"] > k]
        assert after and {h["lr"] for h in after} == {lr} and {h["attempt"] for h in after} == {status["attempt"]}
        donor = items[last["from"]]["status"]
        if any(event["iteration"] < k for event in donor.get("lineage") or ()):
            continue      # the donor's own history before k may have been rewritten since
        donor_at_k = donor["history"][k - 1]
        assert donor_at_k["iteration"] == k
        assert after[0]["loss"] == pytest.approx(step(donor_at_k["loss"], lr), rel=1e-12)   # exploit
        assert lr / donor_at_k["lr"] == pytest.approx(0.8) or lr / donor_at_k["lr"] == pytest.approx(1.2) \
            or lr in (0.01, 0.9)                                                              # explore
        checked += 1
    assert checked >= 1


def test_suspend_pauses_at_a_checkpoint_and_resume_continues_from_it(operator, experiments_api, namespace):
    iterations = 30
    # checkpoints only when a pause asks for one
    create(experiments_api, namespace, resumable("nap", config={"iterations": iterations, "interval": 0.1,
                                                                "checkpoint_every": 0}))
    wait_for(lambda: len(first_status(experiments_api, namespace, "nap").get("history") or ()) >= 3,
             timeout=60, message="a few iterations")
    experiments_api.patch_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", "nap",
                                                   {"spec": {"suspend": True}})
    paused = wait_for(lambda: (status := first_status(experiments_api, namespace, "nap")).get("phase") == "Paused"
                      and "checkpoint" in status and status, timeout=60, message="the trial paused at a checkpoint")
    k = paused["checkpointIteration"]
    assert 3 <= k < iterations and paused["iteration"] == k and os.path.isdir(paused["checkpoint"])
    assert column({"status": paused}, "iteration") == list(range(1, k + 1))
    experiments_api.patch_namespaced_custom_object("kubetune.dev", "v1alpha1", namespace, "experiments", "nap",
                                                   {"spec": {"suspend": False}})
    wait_condition(experiments_api, namespace, "nap", "Succeeded", timeout=60, operator=operator)
    trial = only_trial(experiments_api, namespace, "nap")
    assert_history_is_the_functions(trial, iterations)
    assert column(trial, "attempt") == [0] * k + [1] * (iterations - k)     # resumed after k
    assert not trial["status"].get("failures")
