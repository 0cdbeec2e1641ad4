"""A Ray call stuck in a thread when its cluster goes away is given up (executors/ray/outage.py),
while a call that is merely slow, to a GCS that still accepts connections, is waited for.
Real sockets and threads; the "Ray call" is a function blocked on an event."""
from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

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
    release, returned = threading.Event(), threading.Event()
    endpoint = closed_port()

    def call():
        blocked_call(release)()
        returned.set()

    async def main():
        future = asyncio.ensure_future(asyncio.to_thread(call))
        with pytest.raises(Unavailable, match=f"GCS at 127.0.0.1:{endpoint[1]} is unreachable \\(.*[Rr]efused"):
            await outage_bounded(future, lambda: endpoint, Unavailable, check_s=0.05)
        assert not returned.is_set()     # the thread is still blocked: only the caller was let go
        release.set()
        assert await asyncio.to_thread(returned.wait, 30)
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


def test_a_call_queued_behind_a_blocked_one_is_cancelled_and_the_caller_told_to_use_new_threads():
    release, ran, gave_up = threading.Event(), threading.Event(), []
    endpoint = closed_port()
    pool = ThreadPoolExecutor(1)

    async def main():
        loop = asyncio.get_running_loop()
        blocked = loop.run_in_executor(pool, blocked_call(release))
        queued = loop.run_in_executor(pool, ran.set)
        with pytest.raises(Unavailable):
            await outage_bounded(queued, lambda: endpoint, Unavailable, check_s=0.05,
                                 on_give_up=lambda: gave_up.append(1))
        # the cancellation reaches the pool's work item through a callback the loop runs
        # next: let it run before the blocked thread is released to take the next item
        await asyncio.sleep(0)
        release.set()
        assert await blocked == "answer"
    asyncio.run(main())
    pool.shutdown(wait=True)
    assert gave_up == [1] and not ran.is_set()


def test_a_gcs_that_answers_no_connection_for_long_is_an_outage():
    # a listening socket whose accept queue is full drops further SYNs: connections neither
    # complete nor fail, as to a replaced head Pod's old IP
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(8):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(server.getsockname())
        fillers.append(client)
    release = threading.Event()

    async def main():
        future = asyncio.ensure_future(asyncio.to_thread(blocked_call(release)))
        try:
            with pytest.raises(Unavailable, match=r"is unreachable \(no answer for \d+s\)"):
                await outage_bounded(future, server.getsockname, Unavailable, check_s=0.05, silent_outage_s=0.1)
        finally:
            release.set()
    try:
        asyncio.run(main())
    finally:
        for client in fillers:
            client.close()
        server.close()


def test_a_call_answered_by_the_restarted_cluster_is_an_outage_not_a_trial_error():
    # what a read of a trial's answer raised when it waited out the head's restart
    # (measured: Ray 2.60, test_ray_unavailable's driver); a trial with maxFailures 0 must survive it
    from ray.exceptions import AuthenticationError
    from kubetune.executors.ray.errors import is_unavailable
    restarted = AuthenticationError("RPC error: WrongClusterID: Perhaps the client is accessing GCS after it "
                                    "has restarted.")
    assert is_unavailable(restarted)
    assert not is_unavailable(AuthenticationError("RPC error: the token does not match"))
