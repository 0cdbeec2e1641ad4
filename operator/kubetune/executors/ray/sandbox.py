"""The sandbox a Ray driver process for another cluster enters before it imports Ray
(issue 25): what code a hostile "Ray server" gets to run in it can reach.

Why.  The driver speaks Ray's client protocol, which unpickles what the server sends, and
a tenant may run the "server" (a Service in its own namespace is allowed by default).  The
driver runs as the operator's uid in the operator's container: unconfined, code run in it
could read the ServiceAccount token, the operator's ``/proc/PID/environ`` (its Ray token,
its results-store URL), ptrace or signal the operator, or call anything on the network.

What is left to it, with the kernel's Landlock (kubetune/sandbox/landlock.py):
- files: read and execute Python, its packages and the system's libraries (``/usr``,
  ``/lib*``), a few files of ``/etc`` (DNS, TLS certificates, users), its own
  ``/proc/self`` and the machine-wide counters Ray reads; read and write its own work
  directory (its ``TMPDIR`` and ``HOME``, made by the operator) and ``/dev/null``;
  nothing else: not ``/var/run/secrets``, not the operator's home or configuration, not
  another process's ``/proc`` entries;
- network (ABI >= 4), for a Ray Client address (``ray://host:port``): TCP connections to
  that port only (Landlock knows ports, not hosts), and no listening;
- processes: no ptrace and no ``/proc/PID/mem`` or ``environ`` of a process outside the
  sandbox (any ABI), no signal and no abstract unix socket to one (ABI >= 6).

A GCS address (``host:port``, ``auto``, ``local``: allowed only when the allow-list names
it) makes a full Ray driver, which reaches every node of the cluster on ports it learns
from the GCS, listens itself, and writes the session's files under Ray's temp directory:
for those the network is not confined, and ``/tmp`` (or ``RAY_TMPDIR``), ``/dev/shm`` and
``/proc`` are readable and writable (``/proc`` readable: another process's secrets there
are still behind the ptrace check).
"""
from __future__ import annotations

import os
import pwd
import sys
from urllib.parse import urlsplit

from kubetune.sandbox import landlock

# never granted, nor any directory above them: a path of Python's (a PYTHONPATH entry, the
# working directory) that is ``/`` or ``/var`` would open them all
def _home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir     # the operator's: a driver's HOME is its work directory
    except KeyError:
        return "/"


PROTECTED = ("/var/run/secrets", "/run/secrets", "/proc", _home())
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")
ETC = ("resolv.conf", "hosts", "nsswitch.conf", "host.conf", "gai.conf", "services", "protocols", "ssl", "pki",
       "ca-certificates", "ca-certificates.conf", "localtime", "timezone", "passwd", "group", "ld.so.cache",
       "ld.so.conf", "ld.so.conf.d", "os-release", "mime.types", "hostname")
# machine-wide counters Ray and psutil read (memory, CPUs, cgroup limits); nothing per process
PROC = ("/proc/self", "/proc/thread-self", "/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/loadavg",
        "/proc/uptime", "/proc/version", "/proc/filesystems", "/proc/sys", "/sys/devices/system/cpu",
        "/sys/fs/cgroup")
DEVICES_RW = ("/dev/null", "/dev/zero", "/dev/full")
DEVICES_READ = ("/dev/urandom", "/dev/random")


def client_port(address: str) -> int | None:
    """The port of a Ray Client address (``ray://host:port``), None for any other kind."""
    if not address.startswith("ray://"):
        return None
    try:
        return urlsplit(address).port or 10001      # Ray Client's default port
    except ValueError:
        return None


def python_paths() -> list[str]:
    """Where this interpreter and its packages live (read and execute)."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), *(p for p in sys.path if p)}
    return sorted(p for p in found if not _covers_protected(p))


def _covers_protected(path: str) -> bool:
    real = os.path.realpath(path).rstrip("/") + "/"
    return any((os.path.realpath(p).rstrip("/") + "/").startswith(real) for p in PROTECTED)


def confine(address: str, workdir: str, *, version: int | None = None) -> int:
    """Enter the driver's sandbox for ``address``, with ``workdir`` its only writable
    directory; returns the Landlock ABI used.  Call it first thing, while the process
    has one thread (Landlock confines the calling thread and what it starts later).
    LandlockError if the kernel has no Landlock (the operator checks that before it
    starts a driver: ``available``).  ``version``: an ABI older than the kernel's (tests)."""
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        raise RuntimeError(f"the driver's sandbox must be entered with one thread, not {len(threads)}")
    port = client_port(address)
    client = port is not None
    rules = landlock.Ruleset(connect_tcp=client, bind_tcp=client, version=version)
    for path in [*python_paths(), *SYSTEM, *(f"/etc/{name}" for name in ETC)]:
        rules.allow_path(path, landlock.READ_EXECUTE)
    for path in PROC if client else ("/proc", "/sys/devices/system/cpu", "/sys/fs/cgroup"):
        rules.allow_path(path, landlock.READ)
    for path in DEVICES_READ:
        rules.allow_path(path, landlock.READ_FILE)
    for path in DEVICES_RW:
        rules.allow_path(path, landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV)
    rules.allow_path(workdir, landlock.READ_WRITE)
    if client:
        rules.allow_connect(port)
    else:
        for path in (os.environ.get("RAY_TMPDIR") or "/tmp", "/dev/shm"):
            rules.allow_path(path, landlock.READ_WRITE)
    rules.restrict_self()
    return rules.version


# the ABI that also keeps the driver from signalling processes outside its sandbox (Linux
# 6.12): below it, code sent by a hostile cluster could kill the operator, again after each
# restart (the restored Experiment starts a new driver), which stops every tenant
FULL_ABI = 6


def available() -> int:
    """The Landlock ABI a driver's sandbox would use here (0: none)."""
    return landlock.abi()


def refusal(abi: int, allow_unsandboxed: bool) -> str:
    """"" if a driver process may start on a node whose Landlock ABI is ``abi``, else why
    not and what to change (the operator's admin may accept the risk: ``allow_unsandboxed``)."""
    if allow_unsandboxed or abi >= FULL_ABI:
        return ""
    if abi:
        return (f"not starting a Ray driver process for a cluster other than the operator's own: this node's "
                f"kernel offers Landlock ABI {abi}, which confines that process's files but not "
                f"its signals (ABI {FULL_ABI}, Linux >= 6.12), so code sent by that cluster could kill "
                "the operator, again after each restart; run the operator on a newer kernel, or accept the "
                "risk: operator flag --allow-unsandboxed-ray-drivers, Helm value ray.allowUnsandboxedDrivers=true")
    return ("not starting a Ray driver process for a cluster other than the operator's own: this node's "
            "kernel has no Landlock (Linux >= 5.13 with landlock in its lsm= list), which confines "
            "that process, and unconfined, code sent by that cluster could read the operator's "
            "ServiceAccount token; run the operator on a node with Landlock, or accept the risk: "
            "operator flag --allow-unsandboxed-ray-drivers, Helm value ray.allowUnsandboxedDrivers=true")
