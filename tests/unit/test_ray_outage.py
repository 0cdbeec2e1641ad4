"""A Ray call stuck in a thread when its cluster goes away is given up (executors/ray/outage.py),
while a call that is merely slow, to a GCS that still accepts connections, is waited for.
Real sockets and threads; the "Ray call" is a function blocked on an event."""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from kubetune.executors.ray.outage import outage_bounded


class Unavailable(Exception):
    pass


def closed_port() -> tuple[str, int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()


def blocked_call(release: threading.Event):
    def call():
        if not release.wait(60):
            raise AssertionError("never released")
        return "answer"
    return call


def test_a_call_stuck_while_the_gcs_refuses_connections_is_given_up():
    release = threading.Event()
    endpoint = closed_port()

    async def main():
        future = asyncio.ensure_future(asyncio.to_thread(blocked_call(release)))
        with pytest.raises(Unavailable, match=f"GCS at 127.0.0.1:{endpoint[1]} is unreachable \\(.*[Rr]efused"):
            await outage_bounded(future, lambda: endpoint, Unavailable, check_s=0.05)
        assert not future.done()      # the thread is still blocked: only the caller was let go
        release.set()
        await future
    asyncio.run(main())


@pytest.mark.parametrize("listening", [True, False], ids=["gcs-accepts", "nothing-to-probe"])
def test_a_slow_call_is_waited_for_while_the_gcs_accepts_or_cannot_be_probed(listening):
    release = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    probes = []

    def endpoint():
        probes.append(1)
        if len(probes) == 3:      # three checks found nothing wrong: now the call answers
            release.set()
        return server.getsockname() if listening else None

    async def main():
        future = asyncio.ensure_future(asyncio.to_thread(blocked_call(release)))
        return await outage_bounded(future, endpoint, Unavailable, check_s=0.05)
    try:
        assert asyncio.run(main()) == "answer"
    finally:
        server.close()
    assert len(probes) >= 3


def failing():
    raise ValueError("RPC error: CANCELLED")


def test_a_call_failing_while_the_gcs_accepts_fails_with_its_own_error():
    server = socket.create_server(("127.0.0.1", 0))

    async def main():
        future = asyncio.ensure_future(asyncio.to_thread(failing))
        return await outage_bounded(future, server.getsockname, Unavailable)
    try:
        with pytest.raises(ValueError, match="CANCELLED"):
            asyncio.run(main())
    finally:
        server.close()


def test_a_call_failing_while_the_gcs_refuses_connections_names_the_outage():
    endpoint = closed_port()

    async def main():
        return await outage_bounded(asyncio.ensure_future(asyncio.to_thread(failing)), lambda: endpoint, Unavailable)
    with pytest.raises(Unavailable, match=r"is unreachable \(connection refused\)") as raised:
        asyncio.run(main())
    assert isinstance(raised.value.__cause__, ValueError)
