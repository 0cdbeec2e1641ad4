"""A pod trial's report() against a real HTTP server that is busy: it retries the same
result, never sooner than the operator's Retry-After, and delivers it (AUDIT N6)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kubetune.trainable.pod_session import PodSession, retry_after


class Busy(BaseHTTPRequestHandler):
    answers = [429, 503, 200]
    seen: list[tuple[float, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((time.monotonic(), body))
        status = self.answers[min(len(self.seen) - 1, len(self.answers) - 1)]
        payload = json.dumps({"accepted": status == 200} if status == 200 else {"error": "busy"}).encode()
        self.send_response(status)
        if status != 200:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_) -> None:
        pass


def test_a_busy_operator_is_retried_after_it_says_and_the_result_delivered_once():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        session = PodSession({"KUBETUNE_INGEST_URL": f"http://127.0.0.1:{server.server_port}",
                              "KUBETUNE_TRIAL_TOKEN": "t", "KUBETUNE_TRIAL": "ns/e/e-0", "KUBETUNE_FIRST_SEQ": "4"})
        session.report({"loss": 0.5})
    finally:
        server.shutdown()
    times, bodies = zip(*Busy.seen)
    assert [b["seq"] for b in bodies] == [4, 4, 4] and session.reports == 1
    # each retry waited at least the Retry-After the operator sent (a lower bound: load only adds)
    assert all(later - earlier >= 1.0 for earlier, later in zip(times, times[1:]))


def test_retry_after_is_read_safely_and_capped():
    assert retry_after("2") == 2.0 and retry_after("3600") == 60.0
    assert retry_after(None) is None and retry_after("soon") is None and retry_after("-1") is None
    assert retry_after("nan") is None
