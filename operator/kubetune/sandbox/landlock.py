"""The kernel's unprivileged sandbox, Landlock (Linux >= 5.13), through its three system
calls: what a process may still open, which TCP ports it may connect to, and whom it may
signal, once it has restricted itself.  No root, no capability, no seccomp filter: a
process of any uid can confine itself (after ``no_new_privs``), for good, children included.

Why ctypes and not a binding from PyPI: the interface is three calls and three structs,
stable by design (each ABI version only adds access rights), and the PyPI bindings found
stop at the file-system rights of the first ABIs (no network rules, no scoping).

Each ABI version handles more rights; ``Ruleset`` asks for those the running kernel knows
(``abi()``) and drops the others, so one policy degrades by kernel: ABI 1-3 confine the
file system, 4 adds TCP connect/bind by port, 5 device ioctls, 6 signals and abstract
unix sockets to processes outside the sandbox.  Whatever ABI, a sandboxed process can
neither ptrace nor read the memory or environment (``/proc/PID/environ``) of a process
outside its sandbox: Landlock checks ptrace access by domain from ABI 1 on.

Reference: https://docs.kernel.org/userspace-api/landlock.html (include/uapi/linux/landlock.h).
"""
from __future__ import annotations

import ctypes
import os
import platform
import stat

# system call numbers: the same on every architecture that has Landlock (asm-generic)
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38

# file-system rights, by the ABI that introduced them
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13          # ABI 2: link or rename into another directory
TRUNCATE = 1 << 14       # ABI 3
IOCTL_DEV = 1 << 15      # ABI 5: ioctl on a device file
FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
# the rights that make sense on a file (a rule for a file naming others is EINVAL)
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

READ = READ_FILE | READ_DIR
READ_EXECUTE = READ | EXECUTE
READ_WRITE = READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO \
    | MAKE_SYM | REFER | TRUNCATE

# network rights (ABI 4) and scopes (ABI 6)
BIND_TCP = 1 << 0
CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1


class LandlockError(OSError):
    """Landlock is missing, disabled, or refused a rule."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1      # __attribute__((packed)) in the kernel's header
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        error = ctypes.get_errno()
        raise LandlockError(error, f"{os.strerror(error)} (system call {number})")
    return result


def abi() -> int:
    """The Landlock ABI version the running kernel offers; 0: none (an old kernel, not
    Linux, or Landlock not enabled at boot: ``lsm=...,landlock``)."""
    if platform.system() != "Linux":
        return 0
    try:
        return _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except LandlockError:
        return 0


def no_new_privs() -> None:
    """Neither this process nor its children can gain privileges again (setuid binaries,
    file capabilities); what Landlock requires of an unprivileged process."""
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def not_dumpable() -> bool:
    """No other process of the same uid may ptrace this one or read its memory, its
    ``/proc/PID/environ``, ``mem``, ``maps`` or open fds; no core dump either.  Its
    children are dumpable again once they exec.  False where there is no prctl (not Linux)."""
    if platform.system() != "Linux":
        return False
    if _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise LandlockError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    return True


class Ruleset:
    """What a process may still do once it calls ``restrict_self``: every right of the
    kinds handled here is denied unless a rule allows it.  ``version``: the ABI to use
    (default: the kernel's); rights of later ABIs are dropped, so a policy written for
    the newest kernel still confines as much as an older one can."""

    def __init__(self, *, connect_tcp: bool = True, bind_tcp: bool = True, scoped: bool = True,
                 version: int | None = None) -> None:
        self.version = abi() if version is None else version
        if self.version < 1:
            raise LandlockError(95, "Landlock is not available on this kernel")   # EOPNOTSUPP
        self.handled_fs = FS_BY_ABI[min(self.version, 5)]
        self.handled_net = ((CONNECT_TCP if connect_tcp else 0) | (BIND_TCP if bind_tcp else 0)) \
            if self.version >= 4 else 0
        self.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if scoped and self.version >= 6 else 0
        attr = _RulesetAttr(self.handled_fs, self.handled_net, self.scoped)
        # the struct as long as this ABI knows it: an older kernel rejects fields it lacks
        size = 8 if self.version < 4 else 16 if self.version < 6 else 24
        self._fd = _syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))

    def allow_path(self, path: str, access: int) -> bool:
        """Allow ``access`` beneath ``path`` (a directory) or on it (a file); False if it
        does not exist (nothing to allow)."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            access &= self.handled_fs
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                access &= FILE_RIGHTS
            if access:
                rule = _PathBeneathAttr(access, fd)
                _syscall(_ADD_RULE, ctypes.c_int(self._fd), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                         ctypes.c_uint32(0))
        finally:
            os.close(fd)
        return True

    def allow_connect(self, port: int) -> None:
        """Allow TCP connections to ``port`` (on any host: Landlock knows ports only)."""
        if self.handled_net & CONNECT_TCP:
            rule = _NetPortAttr(CONNECT_TCP, port)
            _syscall(_ADD_RULE, ctypes.c_int(self._fd), ctypes.c_int(_RULE_NET_PORT), ctypes.byref(rule),
                     ctypes.c_uint32(0))

    def restrict_self(self) -> None:
        """Enter the sandbox: this thread now, and every thread and child it starts.
        Call it before starting threads (the others stay outside)."""
        no_new_privs()
        _syscall(_RESTRICT_SELF, ctypes.c_int(self._fd), ctypes.c_uint32(0))
        os.close(self._fd)
