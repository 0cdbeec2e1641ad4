"""Scale (issue 26): 20 Experiments across 4 namespaces, 200 tiny trials in all, on
one operator and one small shared Ray (20 slots for the 40 the Experiments ask for);
the operator is SIGKILLed when half of the trials finished, and started again.
(200 trials, not the issue's 1,000: at the 0.5 trials/s measured here on a loaded
2-core machine, 1,000 would take over half an hour of `make test`.)

Correctness only, never timing (the figures are ``python -m kubetune.bench.scale``'s,
which applies, observes and checks with the same code, kubetune.bench.scale):
- every Experiment Succeeds with all its Trials, indices 0..9 once each, each trial's
  one result counted and stored, and the trial function ran exactly once per trial,
  to its end (its own ledger on disk): nothing lost or duplicated across the restart;
- no Experiment starved: while an Experiment had trials waiting and fewer running than
  its parallelism, at most ``STARVATION_BOUND`` trials of other Experiments completed
  before it started one (fairness.starvation: the order of the trials' own start and
  end times, no duration)."""
from __future__ import annotations

import secrets

import pytest

from kube_fixtures import wait_for
from operator_fixtures import OperatorProcess
from recovery_fixtures import RestartableRay
from kubetune.bench.scale import checks, fairness, shapes
from kubetune.bench.scale.observe import Observer

pytestmark = pytest.mark.integration

EXPERIMENTS, NAMESPACES, TRIALS, PARALLELISM, CPU = 20, 4, 10, 2, 0.05
RAY_CPUS = 1                           # 20 slots of 0.05: fewer than the 40 asked for
# Fair shares start an Experiment's trial about every 20 completions; the longest waits
# seen were 43-59, and 86 when an operator restart restored some Experiments last. An
# Experiment served only after the others waits for all the others' trials (190): that
# fails. The bound sits between the two, at three quarters of all trials, so a loaded CI
# machine's restart order cannot fail a run the benchmark would call fair (its figures
# are bench.scale's to report, not this test's).
STARVATION_BOUND = EXPERIMENTS * TRIALS * 3 // 4


@pytest.fixture
def small_ray():
    head = RestartableRay(num_cpus=RAY_CPUS).start()
    try:
        yield head
    finally:
        head.cleanup()


def test_twenty_experiments_share_one_ray_and_lose_nothing_across_an_operator_sigkill(
        kube_cluster, small_ray, tmp_path):
    planned = shapes.many(experiments=EXPERIMENTS, namespaces=NAMESPACES, trials=TRIALS, reports=1,
                          parallelism=PARALLELISM, cpu=CPU, prefix=f"kt-scale-{secrets.token_hex(3)}")
    namespaces = shapes.namespaces_of(planned)
    keys = [p.key for p in planned]
    total = EXPERIMENTS * TRIALS
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    operator = OperatorProcess(kube_cluster.kubeconfig, small_ray.address, tmp_path, namespaces[0],
                               extra_args=tuple(arg for ns in namespaces[1:] for arg in ("--namespace", ns)))
    with kube_cluster.api_client() as api:
        observer = Observer(api)
        try:
            for namespace in namespaces:
                observer.ensure_namespace(namespace)
            observer.start()
            operator.start()
            observer.apply(planned, str(runs_dir))

            wait_for(lambda: observer.trials_finished(keys) >= total // 2, timeout=900, interval=0.2,
                     message=f"half of the {total} trials finished")
            operator.kill()
            at_kill = observer.trials_finished(keys)
            operator.start()
            assert at_kill < total, "everything finished before the SIGKILL: the restart was not exercised"
            wait_for(lambda: observer.finished(keys) == len(keys) or operator.process.poll() is not None,
                     timeout=900, interval=0.5, message="every Experiment finished after the restart")
            assert operator.process.poll() is None, operator.log()[-5000:]

            verdict = checks.verify(observer.custom, planned, runs_dir=str(runs_dir))
            assert verdict.problems == [], operator.log()[-3000:]
            assert (verdict.experiments, verdict.trials, verdict.results, verdict.runs) == (
                EXPERIMENTS, total, total, total)
            # the results store is written behind the Trials: wait for it, then it must be whole
            wait_for(lambda: not checks.store_problems(planned, operator.results_url)[0], timeout=120,
                     message="every result in the operator's results store")
            assert checks.store_problems(planned, operator.results_url) == ([], total)

            applied = {key: observer.experiments[key].applied for key in keys}
            starved = fairness.starvation(fairness.runs_of(planned, verdict.trials_by_key, applied))
            worst = max(starved, key=starved.get)
            print(f"longest starvation per Experiment (other trials' completions): {sorted(starved.items())}")
            assert starved[worst] <= STARVATION_BOUND, (
                f"{worst} had trials waiting and a free parallelism slot while {starved[worst]} trials of "
                f"other Experiments completed; every Experiment's longest wait: {sorted(starved.items())}")
        finally:
            observer.stop()
            from kubernetes import client
            # deleted while the operator still runs, which lets go of its Experiments;
            # the namespace controller finishes in the background
            for namespace in namespaces:
                client.CoreV1Api(api).delete_namespace(namespace)
            operator.stop_and_report()
