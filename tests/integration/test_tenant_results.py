"""Two teams, one operator (pod executor, results in a real PostgreSQL): tenant A's trial
reports poison strings (NUL, lone surrogates: what PostgreSQL and every UTF-8 encoder
refuse) while a pod of A holds idle connections to the result ingest (a slow-loris, from
its own address, as a pod would).  Tenant B's Experiment finishes on time with every
result stored, A's results are stored too (made storable), and neither Experiment says
the store failed.  (AUDIT N3, N6; the rest of the tenants' attacks: test_tenants.py.)"""
from __future__ import annotations

import json
import socket
import threading

import pytest

from k8s_helpers import create, get_experiment, wait_condition
from kube_fixtures import temporary_namespace, wait_for
from kubetune.devcluster.processes import free_port
from kubetune.executors.pods.ingest_http import MAX_CONNECTIONS
from kubetune.results import open_store
from operator_fixtures import OperatorProcess
from test_pods import Container, bowl, core, custom, pod_experiment, pods_of  # noqa: F401 (core, custom: fixtures)

pytestmark = pytest.mark.integration

SURROGATE = json.loads('"bad \\udcff name"')


class SlowLoris:
    """Keeps ``count`` connections to the ingest open from 127.0.0.2, each with half a
    request line, opening a new one for each the server closes."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SlowLoris":
        self._thread.start()
        wait_for(lambda: self.opened >= self.count, timeout=60, message="the slow-loris connections opened")
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self) -> socket.socket | None:
        try:
            held = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=("127.0.0.2", 0))
            held.sendall(b"POST /v1/results/x/y HTTP/1.1\r\nHost: x\r\n")
            held.setblocking(False)
            self.opened += 1
            return held
        except OSError:
            return None

    def _run(self) -> None:
        held: list[socket.socket] = []
        while not self._stop.is_set():
            alive = []
            for connection in held:
                try:
                    closed = connection.recv(4096) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    connection.close()
                else:
                    alive.append(connection)
            held = alive
            while len(held) < self.count and not self._stop.is_set():
                opened = self._open()
                if opened is None:
                    break
                held.append(opened)
            self._stop.wait(0.2)
        for connection in held:
            connection.close()


@pytest.fixture
def tenants(gpu_cluster):
    with temporary_namespace(gpu_cluster, "kt-tenant-a-") as a, temporary_namespace(gpu_cluster, "kt-tenant-b-") as b:
        yield a, b


def running(core, namespace: str, experiment: str, count: int, tmp_path) -> list[Container]:  # noqa: F811
    pods = wait_for(lambda: (lambda ps: ps if len(ps) == count else None)(
        [p for p in pods_of(core, namespace, experiment) if p.status.phase == "Running"]),
        timeout=60, interval=0.2, message=f"{count} running pods of {namespace}/{experiment}")
    return [Container(core, pod, tmp_path) for pod in pods]


def test_one_tenants_poison_and_slow_loris_leave_the_others_results_flowing(
        gpu_cluster, tenants, postgres_url, core, custom, tmp_path):  # noqa: F811
    a, b = tenants
    operator = OperatorProcess(gpu_cluster.kubeconfig, "local", tmp_path, a,
                               extra_args=("--namespace", b, "--pod-executor", "--ingest-port", str(free_port())))
    operator.results_url = postgres_url
    operator.start()
    try:
        create(custom, a, pod_experiment("poison", budget={"maxTrials": 1}, trial={"resources": {"cpu": 0.1}}))
        create(custom, b, pod_experiment("steady", budget={"maxTrials": 2, "parallelism": 2},
                                         trial={"resources": {"cpu": 0.1}}))
        [poisoner] = running(core, a, "poison", 1, tmp_path)
        steady = running(core, b, "steady", 2, tmp_path)
        port = int(poisoner.env["KUBETUNE_INGEST_URL"].rsplit(":", 1)[1])
        with SlowLoris(port, count=MAX_CONNECTIONS + 44):     # more than every slot of the endpoint
            poisoner.session.report({"loss": 1.0, "note": f"a{chr(0)}b", SURROGATE: SURROGATE})
            poisoner.session.report({"loss": 0.5, f"nul{chr(0)}name": 2.0})
            poisoner.exit(0)
            for container in steady:
                lr = float(container.env["KUBETUNE_PARAM_LR"])
                for iteration in (1, 2, 3):
                    container.session.report({"loss": bowl(lr, iteration)})
                container.exit(0)
            wait_condition(custom, b, "steady", "Succeeded", timeout=120, operator=operator)
            wait_condition(custom, a, "poison", "Succeeded", timeout=120, operator=operator)

        def stored(namespace: str, name: str, count: int):
            store = open_store(postgres_url, create=False)
            try:
                experiment = store.experiment(namespace, name)
                found = store.results(experiment.uid) if experiment is not None else []
            finally:
                store.close()
            return found if len(found) == count else None
        wait_for(lambda: stored(b, "steady", 6), timeout=60, interval=0.5, message="tenant B's 6 results stored")
        first, second = wait_for(lambda: stored(a, "poison", 2), timeout=60, interval=0.5,
                                 message="tenant A's 2 results stored, made storable")
        assert first.metrics["note"] == "a\ufffdb" and first.metrics["bad \ufffd name"] == "bad \ufffd name"
        assert second.metrics["nul\ufffdname"] == 2.0
        for namespace, name in ((a, "poison"), (b, "steady")):
            conditions = get_experiment(custom, namespace, name)["status"]["conditions"]
            assert not [c for c in conditions if c["type"] in ("ResultsStoreUnavailable", "ResultsRejected")
                        and c["status"] == "True"], conditions
    finally:
        operator.stop_and_report()
