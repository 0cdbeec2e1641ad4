"""The pod executor's Kubernetes calls are bounded (AUDIT N13): against a server that
accepts the connection and never answers (a half-open connection to the API server),
every call gives up at its request timeout instead of hanging the executor's thread;
a failed pod's log tail is read up to its byte limit, whatever the server sends."""
from __future__ import annotations

import socket
import threading

import kubernetes
import pytest

from kubetune.k8s.errors import ApiError
from kubetune.k8s.kueue import KueueApi
from kubetune.k8s.pods import PodApi


class Server:
    """A TCP server that either never answers or answers every request with ``body``."""

    def __init__(self, body: bytes | None = None) -> None:
        self.body = body
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(connection)
            if self.body is not None:
                connection.recv(65536)
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(self.body)}\r\n"
                        "\r\n").encode()
                try:
                    connection.sendall(head + self.body)
                except OSError:
                    pass

    def client(self) -> kubernetes.client.ApiClient:
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.port}"
        return kubernetes.client.ApiClient(configuration)

    def close(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()


def finishes(call, within: float = 60.0):
    """Run ``call`` in a thread; its outcome (or the exception it raised), or fail if it hangs."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    assert outcome, f"{call} still waiting after {within}s: no request timeout"
    return outcome[0]


@pytest.mark.parametrize("call", [
    lambda api: api.list_pods("ns", label_selector="a=b"),
    lambda api: api.create_pod("ns", {"metadata": {"name": "p"}}),
    lambda api: api.read_secret("ns", "s"),
    lambda api: api.trial_uid("ns", "t"),
    lambda api: api.list_events("ns", "involvedObject.kind=Pod"),
    lambda api: api.pod_log_tail("ns", "p", 20),
])
def test_a_silent_api_server_costs_a_call_its_timeout_not_the_thread(call):
    server = Server()
    try:
        api = PodApi(server.client(), request_timeout=(0.5, 0.5))
        outcome = finishes(lambda: call(api))
        assert isinstance(outcome, Exception) and not isinstance(outcome, ApiError), outcome
    finally:
        server.close()


def test_kueue_reads_have_a_timeout_too(monkeypatch):
    monkeypatch.setattr("kubetune.k8s.kueue.REQUEST_TIMEOUT", (0.5, 0.5))
    server = Server()
    try:
        outcome = finishes(lambda: KueueApi(server.client()).list_workloads("ns", ["uid-1"]))
        assert isinstance(outcome, Exception), outcome
    finally:
        server.close()


def test_a_failed_pods_log_tail_is_cut_to_its_byte_limit():
    server = Server(body=b"\xff\xfe binary garbage " * 500_000)     # ~9 MB, whatever limitBytes said
    try:
        tail = finishes(lambda: PodApi(server.client()).pod_log_tail("ns", "p", 20, max_bytes=16 * 1024))
        assert isinstance(tail, str) and len(tail.encode()) <= 3 * 16 * 1024   # U+FFFD is 3 bytes of 1
        assert len(tail) <= 16 * 1024
    finally:
        server.close()
