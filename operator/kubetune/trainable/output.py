"""Capture what a trial prints: a ring buffer of its last lines, for ``logs()``.

``install()`` replaces ``sys.stdout``/``sys.stderr`` of a trial worker process by tees
that still write to the original streams (so Ray's own log files and log
forwarding keep working) and append each line to the output buffer of the trial
running on the writing thread (or the process's only trial).  Output written
straight to file descriptors by native code is not seen.
"""
from __future__ import annotations

import collections
import sys
import threading
from typing import Callable, TextIO


class LineBuffer:
    """The last ``max_lines`` lines written, partial last line included.

    A line longer than ``max_line_chars`` keeps its start and says how much was cut:
    a program that prints without newlines (a progress bar redrawn with ``\r``) must
    not grow the buffer without limit, nor make each write re-join what came before.
    """

    def __init__(self, max_lines: int = 1000, max_line_chars: int = 4096):
        self._lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self._max_line_chars = max_line_chars
        self._partial: list[str] = []      # pieces of the unfinished line, at most max_line_chars
        self._partial_chars = 0
        self._cut = 0                      # characters of the unfinished line not kept
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        pieces = text.split("\n")
        with self._lock:
            for index, piece in enumerate(pieces):
                if index:
                    self._lines.append(self._finish_line())
                room = self._max_line_chars - self._partial_chars
                if len(piece) > room:
                    self._cut += len(piece) - room
                    piece = piece[:room]
                if piece:
                    self._partial.append(piece)
                    self._partial_chars += len(piece)

    def _finish_line(self) -> str:
        line = "".join(self._partial)
        if self._cut:
            line += f" ... [{self._cut} characters cut]"
        self._partial, self._partial_chars, self._cut = [], 0, 0
        return line

    def tail(self, lines: int | None = None) -> str:
        with self._lock:
            partial = "".join(self._partial) + (f" ... [{self._cut} characters cut]" if self._cut else "")
            content = list(self._lines) + ([partial] if partial else [])
        if lines is not None:
            content = content[-lines:] if lines > 0 else []
        return "\n".join(content)


class _Tee:
    def __init__(self, original: TextIO, target: Callable[[], LineBuffer | None]):
        self._original = original
        self._target = target

    def write(self, text: str) -> int:
        buffer = self._target()
        if buffer is not None:
            buffer.write(text)
        return self._original.write(text)

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._original, name)


_installed = False
_install_lock = threading.Lock()


def install(target: Callable[[], LineBuffer | None]) -> None:
    """Tee this process's stdout and stderr into ``target()`` (once per process)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        sys.stdout = _Tee(sys.stdout, target)
        sys.stderr = _Tee(sys.stderr, target)
        _installed = True
