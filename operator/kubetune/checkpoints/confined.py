"""Copy a directory that a trial pod can change while the operator copies it.

``storage.confine`` checks a reported checkpoint's real path, but a path is looked up
again at every use: between the check and the copy a pod sharing the storage can swap
a directory of it for a symlink (to the operator's ServiceAccount token, say).  So the
copy never looks a path up twice.  It walks from the storage root with directory file
descriptors, opening every component below it with ``O_NOFOLLOW``, and copies from
the descriptors it holds.  Whatever is a symbolic link at the moment it is opened, or
is not a regular file or a directory (a FIFO, a device), is refused, not followed.  The
destination, the recipient trial's own directory (which its pod can change as well),
is written the same way.
"""
from __future__ import annotations

import errno
import os
import shutil
import stat

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
CHUNK = 1 << 20


class UnsafeEntry(OSError):
    """A symbolic link, or something other than a regular file or a directory."""


def open_below(root: str, relative: str, *, create: bool = False) -> int:
    """A descriptor of directory ``root/relative``: ``root`` (the operator's own storage
    path) is opened as configured, every component below it without following a link
    (``create``: missing ones are made).  The caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for part in [p for p in relative.split("/") if p]:
            if part in (".", ".."):
                raise UnsafeEntry(f"{relative}: a '.' or '..' segment")
            if create:
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
            child = _open_dir(part, fd, relative)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(name: str, dir_fd: int, where: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):   # a symlink, or not a directory
            raise UnsafeEntry(f"{where}: {name} is a symbolic link or not a directory") from error
        raise


def clone(root: str, source: str, target: str, name: str, tmp_name: str, stale: tuple[str, ...]) -> None:
    """Copy directory ``root/source`` to ``root/target/name`` through ``tmp_name`` (so no
    reader sees half of it), replacing any ``name``, then remove the entries of
    ``root/target`` starting with one of ``stale``.  FileNotFoundError: no such source."""
    source_fd = open_below(root, source)
    try:
        target_fd = open_below(root, target, create=True)
        try:
            try:
                copy_tree(source_fd, target_fd, tmp_name, source)
                remove(target_fd, name)
                os.rename(tmp_name, name, src_dir_fd=target_fd, dst_dir_fd=target_fd)
            except BaseException:
                remove(target_fd, tmp_name)
                raise
            for entry in os.listdir(target_fd):
                if entry != name and entry.startswith(stale):
                    remove(target_fd, entry)
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)


def copy_tree(source_fd: int, target_dir_fd: int, name: str, where: str) -> None:
    """Copy the directory open as ``source_fd`` to a new directory ``name`` in ``target_dir_fd``."""
    os.mkdir(name, 0o777, dir_fd=target_dir_fd)
    target = _open_dir(name, target_dir_fd, where)
    try:
        with os.scandir(source_fd) as entries:
            listed = [entry.name for entry in entries]
        for entry in listed:
            _copy_entry(source_fd, target, entry, f"{where}/{entry}")
    finally:
        os.close(target)


def _copy_entry(source_dir_fd: int, target_dir_fd: int, name: str, where: str) -> None:
    try:
        fd = os.open(name, _FILE, dir_fd=source_dir_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafeEntry(f"{where} is a symbolic link: the operator copies no links") from error
        raise
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            copy_tree(fd, target_dir_fd, name, where)
            return
        if not stat.S_ISREG(mode):
            raise UnsafeEntry(f"{where} is neither a regular file nor a directory")
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=target_dir_fd)
        try:
            while True:
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
        finally:
            os.close(out)
    finally:
        os.close(fd)


def remove(dir_fd: int, name: str) -> None:
    """Remove entry ``name`` of ``dir_fd`` whatever it is (rmtree's fd-based walk follows no link)."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
