"""One operator, two teams (issue 25): tenant A attacks the operator from its Experiments and
trials at once; tenant B's Experiment finishes with every result stored, the operator stays
up (its liveness endpoint answers, it never restarted), and nothing of A's code runs in it.
The real thing: one `kubetune operator` process with its default allow-list (its own Ray
plus Services of an Experiment's own namespace), the real API server, a real Ray head.

Tenant A tries, all while B runs:
- a trial whose actor returns a pickle instead of kubetune's JSON answer (N1): the trial
  fails as rejected, and the marker its unpickling would write never appears;
- ``spec.ray.address`` at a listener of its own, and at a Service of B's namespace (N2):
  both Experiments fail naming the allow-list, and the listener records no connection;
- a ``randint: [0, 2147483647]`` with an initial point (N4, the 21 GiB case): it runs;
- poison strings (NUL, lone surrogates) in metrics and in its error: it fails alone,
  its results stored (made storable);
- ``parallelism: 1000`` (N7) whose trials hold the cluster's GPUs and queue behind them;
- a slow-loris on the result ingest (N6): more idle connections than the ingest has slots.
The ingest slow-loris against pod trials' results and the store's poison on PostgreSQL:
test_tenant_results.py."""
from __future__ import annotations

import socket
import threading

import pytest
from kubernetes.client.exceptions import ApiException

from k8s_helpers import condition, create, experiment, experiment_gone, get_experiment, trials, wait_condition
from kube_fixtures import temporary_namespace, wait_for
from kubetune.devcluster.processes import free_port
from kubetune.executors.pods.ingest_http import MAX_CONNECTIONS
from kubetune.k8s.client import GROUP, VERSION
from lifecycle_helpers import http_status
from operator_fixtures import OperatorProcess
from test_results_operator import stored_results
from test_tenant_results import SlowLoris

pytestmark = pytest.mark.integration

BUDGET_S = 240      # for each wait; the whole test takes ~2 minutes on a loaded 2-core machine


class Listener:
    """A TCP server that counts every connection made to it (a tenant's fake Ray head)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.socket.close()


def liveness(port: int) -> int:
    return http_status(f"http://127.0.0.1:{port}/healthz", timeout=10)


@pytest.fixture
def tenants(kube_cluster, ray_local, tmp_path):
    with temporary_namespace(kube_cluster, "kt-team-a-") as a, temporary_namespace(kube_cluster, "kt-team-b-") as b:
        health, ingest = free_port(), free_port()
        operator = OperatorProcess(kube_cluster.kubeconfig, ray_local, tmp_path, a, extra_args=(
            "--namespace", b, "--liveness", f"http://127.0.0.1:{health}/healthz",
            "--pod-executor", "--ingest-port", str(ingest)))
        operator.start()
        try:
            yield operator, a, b, health, ingest
        finally:
            operator.stop_and_report()


def test_one_tenant_cannot_reach_the_operator_or_another_tenants_work(tenants, experiments_api, tmp_path):
    operator, a, b, health, ingest = tenants
    api = experiments_api
    marker = tmp_path / "unpickled"
    listener = Listener()
    try:
        wait_for(lambda: liveness(health) == 200, timeout=120, message="the operator's liveness endpoint")
        # the cluster's 4 GPUs held by A's first 4 trials, 996 more queued behind them
        create(api, a, experiment("wide", entrypoint="kubetune.examples.sleepy:train",
                                  objective={"metric": "step", "mode": "max"},
                                  budget={"maxTrials": 1000, "parallelism": 1000},
                                  trial={"resources": {"cpu": 0.01, "gpu": 1},
                                         "config": {"hold_after": 0, "gate": str(tmp_path / "never")}}))
        create(api, a, experiment("pickle", entrypoint="kubetune.examples.hostile:plants_pickle",
                                  budget={"maxTrials": 1}, trial={"maxFailures": 0, "config": {
                                      "marker": str(marker), "how": "return", "interval": 0.05}}))
        create(api, a, experiment("foreign", ray={"address": f"ray://127.0.0.1:{listener.port}"},
                                  budget={"maxTrials": 1}))
        create(api, a, experiment("neighbour", ray={"address": f"ray://ray-head.{b}.svc:10001"},
                                  budget={"maxTrials": 1}))
        create(api, a, experiment("huge", search_space={"x": {"uniform": [-3, 3]},
                                                        "seed": {"randint": [0, 2147483647]}},
                                  search={"initialPoints": [{"x": 1.0, "seed": 1}]}, budget={"maxTrials": 1}))
        create(api, a, experiment("poison", entrypoint="kubetune.examples.hostile:poisons",
                                  budget={"maxTrials": 1}, trial={"maxFailures": 0}))
        with SlowLoris(ingest, count=MAX_CONNECTIONS + 44):     # every slot of the ingest, and more
            create(api, b, experiment("steady", budget={"maxTrials": 3, "parallelism": 1}))
            done = wait_condition(api, b, "steady", "Succeeded", timeout=BUDGET_S, operator=operator)
            assert done["status"]["trialCounts"]["succeeded"] == 3
            assert liveness(health) == 200
        stored = wait_for(lambda: (s := stored_results(operator.results_url, "steady", b))
                          and sum(len(t.get("results") or []) for t in s.get("trials", [])) == 15 and s,
                          timeout=60, message="tenant B's 15 results stored")
        assert {t["phase"] for t in stored["trials"]} == {"Succeeded"}

        for name in ("foreign", "neighbour"):
            refused = condition(wait_condition(api, a, name, "Failed", timeout=60, operator=operator), "Failed")
            assert refused["reason"] == "RayAddressRefused", refused
            assert "--ray-allowed-addresses" in refused["message"] and "ray.allowedAddresses" in refused["message"]
        assert listener.connections == 0

        wait_condition(api, a, "pickle", "Failed", timeout=BUDGET_S, operator=operator)
        (trial,) = trials(api, a, "pickle")
        assert "TrialRejected" in str(trial.get("status")), trial.get("status")
        assert not marker.exists(), "the trial's pickle was unpickled by pid " + marker.read_text()

        wait_condition(api, a, "huge", "Succeeded", timeout=BUDGET_S, operator=operator)
        poisoned = wait_condition(api, a, "poison", "Failed", timeout=BUDGET_S, operator=operator)
        assert "RuntimeError: poison" in str(poisoned["status"]), poisoned["status"]
        poison = wait_for(lambda: (s := stored_results(operator.results_url, "poison", a))
                          and sum(len(t.get("results") or []) for t in s.get("trials", [])) == 2 and s,
                          timeout=60, message="tenant A's poisoned results stored, made storable")
        first = poison["trials"][0]["results"][0]["metrics"]
        assert first["tag"] == "nul\ufffdhere" and first["odd"] == "lone\ufffdsurrogate", first

        def wide_queued():
            status = get_experiment(api, a, "wide").get("status") or {}
            counts = status.get("trialCounts") or {}
            return status if sum(counts.values()) >= 1000 and counts.get("queued", 0) >= 996 else None
        wide = wait_for(wide_queued, timeout=BUDGET_S, interval=1, message="A's 1,000 trials created, 996 queued")
        assert wide["phase"] == "Running" and wide["trialCounts"]["running"] <= 4, wide
        assert liveness(health) == 200
        assert operator.process.poll() is None and operator.starts == 1
    finally:
        listener.close()
        # A's trials end with their Experiments (the operator ends their actors), so the
        # session's Ray head has its GPUs back for the next test
        for name in ("wide", "pickle", "huge", "poison", "foreign", "neighbour"):
            try:
                api.delete_namespaced_custom_object(GROUP, VERSION, a, "experiments", name)
            except ApiException as error:
                if error.status != 404:
                    raise
        wait_for(lambda: all(experiment_gone(api, a, name) for name in ("wide", "pickle")), timeout=BUDGET_S,
                 message="tenant A's Experiments deleted, their actors ended")
