"""A flood of bogus result POSTs, in a process of its own at a lower CPU priority than the operator:
what it measures is what the flood does to the operator through its endpoint, not two
processes sharing the test machine's cores.

``python ingest_flood.py PORT NAMESPACE VICTIM CONCURRENCY COUNT_FILE`` keeps CONCURRENCY
POSTs in flight (each on its own connection, ``Connection: close``): for trials that
do not exist, with made-up tokens, and for the trial VICTIM with a wrong token, from 8
source addresses (127.0.0.2-9: pods other than the measured ones).  It writes how many
were answered to COUNT_FILE as it goes."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path


class Flood:
    def __init__(self, port: int, namespace: str, victim: str, workdir: Path, concurrency: int = 100) -> None:
        self.args = [str(port), namespace, victim, str(concurrency)]
        self.count_file = workdir / "flood-count"
        self.process: subprocess.Popen | None = None

    @property
    def sent(self) -> int:
        try:
            return int(self.count_file.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def __enter__(self) -> "Flood":
        from kube_fixtures import wait_for
        self.process = subprocess.Popen([sys.executable, __file__, *self.args, str(self.count_file)],
                                        preexec_fn=lambda: os.nice(3))
        wait_for(lambda: self.sent >= 50 or self.process.poll() is not None, timeout=60, interval=0.1,
                 message="the flood under way")
        assert self.process.poll() is None, "the flood process ended"
        return self

    def __exit__(self, *_) -> None:
        self.process.terminate()
        self.process.wait(30)


async def _post(port: int, namespace: str, trial: str, token: str, source: str) -> bool:
    body = b'{"seq": 0, "iteration": 1, "metrics": {"loss": 0}}'
    try:
        # from addresses of their own, as several other pods would (the ingest limits each
        # source address to a few connections: 8 addresses keep the 100 posts in flight)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        writer.write(f"POST /v1/results/{namespace}/{trial} HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        answered = bool(await reader.read())
        writer.close()
        return answered
    except OSError:
        return False


async def _flood(port: int, namespace: str, victim: str, concurrency: int, count_file: str) -> None:
    slots = asyncio.Semaphore(concurrency)
    answered = 0

    async def one(n: int) -> None:
        nonlocal answered
        try:
            if await _post(port, namespace, victim if n % 2 else f"bogus-{n}", f"guess-{n}", f"127.0.0.{2 + n % 8}"):
                answered += 1
                if answered % 10 == 0:
                    # written whole, then renamed: a reader never sees the file empty mid-write
                    # (write_text truncates first: a read then counted 0 and failed the test)
                    partial = Path(f"{count_file}.partial")
                    partial.write_text(str(answered))
                    partial.replace(count_file)
        finally:
            slots.release()

    n, tasks = 0, set()
    while True:
        await slots.acquire()
        task = asyncio.create_task(one(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1


if __name__ == "__main__":
    port, namespace, victim, concurrency, count_file = sys.argv[1:6]
    asyncio.run(_flood(int(port), namespace, victim, int(concurrency), count_file))
