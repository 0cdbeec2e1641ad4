"""What every benchmark report records about where it ran: the machine, the packages, the
load average and the commit (with whether the checkout had changes)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

KIB = 1024


def loadavg_text() -> str:
    """The 1, 5 and 15 minute load averages, as every benchmark report shows them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_info(repo: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpus": os.cpu_count(), "python": platform.python_version(), "os": platform.platform(),
        "memory_gib": _memory_bytes() / KIB ** 3, "cpu_model": _cpu_model(),
        "loadavg_start": loadavg_text(),
        "argv": sys.argv,
    }
    try:
        import ray
        info["ray"] = ray.__version__
    except ImportError:
        info["ray"] = "not installed"
    from importlib.metadata import PackageNotFoundError, version
    try:
        info["kubetune"] = version("kubetune")
    except PackageNotFoundError:
        info["kubetune"] = "unknown"
    for package in ("optuna", "kopf", "kubernetes"):
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            pass
    info["git_commit"], info["git_dirty"] = git_state(repo)
    return info


def _memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * KIB
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def git_state(repo: str | None = None) -> tuple[str, bool]:
    """(commit, whether tracked files differ from it) of the checkout this code runs from."""
    cwd = repo or os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return commit or "unknown", dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


def commit_label(repo: str | None = None) -> str:
    """The commit a figure was measured on, for a report: ``abc123def456``, with
    ``-dirty`` when tracked files differ from it (so a figure from changed code says so)."""
    commit, dirty = git_state(repo)
    return f"{commit}-dirty" if dirty else commit
