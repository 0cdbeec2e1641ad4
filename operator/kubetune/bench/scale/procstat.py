"""The operator's memory and CPU from /proc: its process and every descendant (a Ray
driver or a helper it spawns counts as the operator's), sampled in a thread.

Peak RSS is the largest sum of the tree's resident memory seen at a sample (and
never less than the operator process's own ``VmHWM``); CPU is user + system time,
including children already reaped."""
from __future__ import annotations

import os
import threading
from typing import Iterable

PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _read(pid: int, name: str) -> str | None:
    """/proc/<pid>/<name>, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as handle:
            return handle.read()
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    text = _read(pid, "stat")
    return text.rsplit(")", 1)[1].split() if text and ")" in text else None


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def usage(pids: Iterable[int]) -> tuple[int, float]:
    """The resident bytes and the CPU seconds (utime stime cutime cstime) of ``pids``."""
    pages = ticks = 0
    for fields in filter(None, map(_stat, pids)):
        pages += int(fields[21])
        ticks += sum(int(x) for x in fields[11:15])
    return pages * PAGE, ticks / TICKS


def rss_bytes(pids: Iterable[int]) -> int:
    return usage(pids)[0]


def hwm_bytes(pid: int) -> int:
    """The process's own peak resident memory (VmHWM)."""
    for line in (_read(pid, "status") or "").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


class ProcessWatch:
    """Samples one process tree every ``interval_s`` until stopped; ``figures()`` then."""

    def __init__(self, pid: int, interval_s: float = 1.0) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_rss = 0
        self.cpu_s = 0.0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"procstat-{pid}")

    def start(self) -> "ProcessWatch":
        self._thread.start()
        return self

    def _sample(self) -> None:
        pids = descendants(self.pid)
        if _stat(self.pid) is None:
            return
        rss, cpu_s = usage(pids)
        self.peak_rss = max(self.peak_rss, rss, hwm_bytes(self.pid))
        self.cpu_s = max(self.cpu_s, cpu_s)
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[str, float]:
        """Call before the process is killed or reaped: a last sample, then the figures."""
        self._sample()
        self._stop.set()
        self._thread.join(10)
        return {"peak_rss_mib": self.peak_rss / 2 ** 20, "cpu_s": self.cpu_s, "samples": self.samples}
