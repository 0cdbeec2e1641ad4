"""The result ingest endpoint against real sockets: it authenticates from the headers
alone (no body read, no API call), bounds what a connection may hold and for how
long, and bounds each trial's buffer (executors/pods/ingest.py, ingest_http.py)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from kubetune.executors.pods import ingest as pod_ingest
from kubetune.executors.pods.ingest import IngestServer, ResultInbox


def result(seq: int, **extra) -> dict:
    return {"seq": seq, "iteration": seq + 1, "metrics": {"loss": 1.0}, **extra}


async def post(port: int, path: str, body: bytes, token: str | None = "secret", **headers: str) -> tuple[int, dict, dict]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    answer_headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), json.loads(payload), answer_headers


def serve(test, **limits):
    async def run():
        inbox = ResultInbox()
        inbox.open("ns/exp/exp-0", "secret", attempt=0, after_seq=-1)
        server = IngestServer(inbox, host="127.0.0.1", port=0, **limits)
        await server.start()
        try:
            await test(server, inbox)
        finally:
            await server.stop()
    asyncio.run(run())


def test_a_token_is_checked_before_the_body_is_read_and_scoped_to_one_trial():
    async def test(server, inbox):
        inbox.open("ns/exp/exp-1", "other", attempt=0, after_seq=-1)
        path = "/v1/results/ns/exp-0"
        assert (await post(server.port, path, json.dumps(result(0)).encode()))[:2] == (200, {"accepted": True})
        assert (await post(server.port, path, json.dumps(result(1)).encode(), token="other"))[0] == 403
        assert (await post(server.port, path, json.dumps(result(1)).encode(), token=None))[0] == 403
        # refused on its headers: a body it announced but never sends holds nothing
        status, _, _ = await post(server.port, path, b"", token="wrong", Content_Length="1000000")
        assert status == 403
        # a trial the operator does not know costs nothing and is told to retry
        status, answer, headers = await post(server.port, "/v1/results/ns/nobody", b"{}", token="x")
        assert status == 503 and headers["retry-after"] == "2" and "not known" in answer["error"]
        assert inbox.token("ns", "exp-0") != "secret"     # only the hash is held
    serve(test)


def test_bodies_and_counters_out_of_bounds_are_refused():
    async def test(server, inbox):
        path = "/v1/results/ns/exp-0"
        status, answer, _ = await post(server.port, path, b"x" * 10, Content_Length=str(pod_ingest.MAX_BODY_BYTES + 1))
        assert status == 413 and "at most" in answer["error"]
        for body, field in ((result(2 ** 31), "seq"), ({**result(0), "iteration": 2 ** 40}, "iteration"),
                            (result(0, checkpoint="/x" * 4000), "checkpoint"), (result(0, attempt=-1), "attempt")):
            status, answer, _ = await post(server.port, path, json.dumps(body).encode())
            assert status == 400 and answer["error"].startswith(field), answer
    serve(test)


def test_a_full_buffer_answers_429_with_retry_after(monkeypatch):
    monkeypatch.setattr(pod_ingest, "MAX_BUFFERED_PER_TRIAL", 3)

    async def test(server, inbox):
        path = "/v1/results/ns/exp-0"
        for seq in range(3):
            assert (await post(server.port, path, json.dumps(result(seq)).encode()))[0] == 200
        status, _, headers = await post(server.port, path, json.dumps(result(3)).encode())
        assert status == 429 and headers["retry-after"] == "2"
        inbox.take("ns/exp/exp-0", after_seq=2)       # the controller took them: room again
        assert (await post(server.port, path, json.dumps(result(3)).encode()))[0] == 200
    serve(test)


def test_the_buffer_is_bounded_in_bytes_too(monkeypatch):
    monkeypatch.setattr(pod_ingest, "MAX_BUFFERED_BYTES_PER_TRIAL", 3000)

    async def test(server, inbox):
        path = "/v1/results/ns/exp-0"
        big = lambda seq: json.dumps({**result(seq), "metrics": {"blob": "x" * 1000}}).encode()  # noqa: E731
        statuses = [(await post(server.port, path, big(seq)))[0] for seq in range(4)]
        assert statuses == [200, 200, 429, 429]
    serve(test)


@pytest.mark.parametrize("sent", [b"POST /v1/results/ns/exp-0 HTT", b"POST /v1/results/ns/exp-0 HTTP/1.1\r\n"
                                  b"Authorization: Bearer secret\r\nContent-Length: 100\r\n\r\n{"])
def test_a_slow_client_is_answered_408_and_closed_within_the_timeout(sent):
    async def test(server, inbox):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(sent)          # and then nothing: headers or body never complete
        started = time.monotonic()
        raw = await asyncio.wait_for(reader.read(), 5)     # never answered: TimeoutError
        elapsed = time.monotonic() - started
        # answered at the timeout, not at once (how late depends on the machine's load)
        assert raw.startswith(b"HTTP/1.1 408") and elapsed >= 0.3, (raw, elapsed)
        writer.close()
    serve(test, header_timeout_s=0.5, body_timeout_s=0.5)


def test_connections_beyond_the_cap_are_closed_at_once():
    async def test(server, inbox):
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), 2) == b""     # closed unanswered
        for _, w in held:
            w.close()
        writer.close()
    serve(test, max_connections=2, header_timeout_s=30)


def test_oversized_headers_are_refused():
    async def test(server, inbox):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /v1/results/ns/exp-0 HTTP/1.1\r\nX: " + b"a" * 40_000 + b"\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 5)
        assert raw.startswith(b"HTTP/1.1 431")
        writer.close()
    serve(test)


def test_one_client_holding_idle_connections_cannot_lock_out_the_others():
    """AUDIT N6: one pod opening idle connections (a slow-loris) holds its own few slots,
    never the ones another trial's pod posts through (a pod is one source address; the
    flood comes from 127.0.0.2 here, the real trial from 127.0.0.1)."""
    async def test(server, inbox):
        flood = [await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
                 for _ in range(30)]
        status, answer, _ = await post(server.port, "/v1/results/ns/exp-0", json.dumps(result(0)).encode())
        assert (status, answer) == (200, {"accepted": True})
        assert server._http.refused == 30 - 4    # beyond its share of 4: closed unanswered at once
        for _, writer in flood:
            writer.close()
    serve(test, max_connections=20, max_per_client=4, header_timeout_s=30)
