"""Work directories of the Ray driver processes (process.py), and removing those whose
operator is gone.

Each driver process gets a directory of its own under the temporary directory (in the
chart: the pod's /tmp, an emptyDir).  The operator that made it removes it when its
driver ends; one killed before it could (SIGKILL, OOM) leaves it behind, so the next
operator removes those of operators no longer running.

"No longer running" cannot be told from a pid alone: an emptyDir outlives the
container, and the operator of every container is pid 1, so the directories of the
container before a restart carry the pid of the running operator.  A directory is
therefore named after its operator's *process identity*: pid, the process's start
time (clock ticks since boot, /proc/<pid>/stat field 22) and the boot's id.  A pid
reused by another process, in this container or after a reboot, has another start
time or boot: its directories are removed."""
from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile

PREFIX = "kubetune-ray-driver-"
# kubetune-ray-driver-p<pid>.<start time>.<boot>-<mkdtemp's suffix>
_NAMED = re.compile(r"p(\d+)\.(\d+)\.([0-9a-f]+)-")
# the names of earlier versions: kubetune-ray-driver-<pid>-<suffix>
_PID_ONLY = re.compile(r"(\d+)-")


def process_identity(pid: int) -> str | None:
    """``"<pid>.<start time>.<boot>"`` of a running process; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields follow the last ")"
    fields = stat.rpartition(")")[2].split()
    return f"{pid}.{fields[19]}.{_boot_id()}"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip().replace("-", "")[:12]
    except OSError:
        return "0"


def new_workdir(root: str | None = None) -> str:
    """A new work directory for a driver process (mode 0700), named after this process's
    identity; the directories of operators no longer running are removed first."""
    root = root or tempfile.gettempdir()
    remove_orphans(root)
    identity = process_identity(os.getpid()) or f"{os.getpid()}.0.0"     # no /proc: nothing is removed
    return tempfile.mkdtemp(prefix=f"{PREFIX}p{identity}-", dir=root)


def remove_orphans(root: str) -> list[str]:
    """Remove the work directories under ``root`` whose operator no longer runs; returns them."""
    removed: list[str] = []
    own_pid = os.getpid()
    if process_identity(own_pid) is None:
        return removed      # no /proc to tell a running operator from a gone one
    for path in glob.glob(os.path.join(root, f"{PREFIX}*")):
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        if _orphaned(os.path.basename(path)[len(PREFIX):], own_pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _orphaned(name: str, own_pid: int) -> bool:
    named = _NAMED.match(name)
    if named:
        pid = int(named.group(1))
        return process_identity(pid) != f"{pid}.{named.group(2)}.{named.group(3)}"
    legacy = _PID_ONLY.match(name)
    if legacy:
        # named by pid only: this process made none of them (it names its own by identity),
        # so one carrying its pid is a previous container's; otherwise gone if its pid is
        pid = int(legacy.group(1))
        return pid == own_pid or process_identity(pid) is None
    return False
