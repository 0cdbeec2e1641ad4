"""The stdout result format (``spec.trial.metricsCollector: stdout``): pure parsing, no I/O.

A trial container that cannot import kubetune prints one line per result:

    KUBETUNE_RESULT {"loss": 0.31, "accuracy": 0.88, "iteration": 2}

- the line starts with ``KUBETUNE_RESULT`` and a space; the rest is one JSON object;
- its keys are metrics, except ``iteration`` (an integer >= 1; default: the previous
  result's iteration + 1, the first one following the iterations already done) and
  ``checkpoint`` (a location string, as ``kubetune.report`` would record);
- every other line is the program's own output and is ignored.

The n-th ``KUBETUNE_RESULT`` line of an attempt's log (malformed ones included) is
that attempt's n-th result: seq ``KUBETUNE_FIRST_SEQ + n - 1``, the numbering
kubetune's own trial-side session uses.  So reading a log again from its first line
(after an operator restart, or a dropped stream) yields the same seqs, and the
ingest's seq dedupe records each result once.

A line longer than ``MAX_LINE_CHARS`` is never held whole: ``LogLines`` keeps its
first ``MAX_LINE_CHARS`` bytes and marks it overlong; a result line cut so is
malformed (it keeps its seq, reported as a Warning), any other is the program's own
output and is skipped as before.  So a program that prints without newlines (a
progress bar redrawn with ``\r``) costs the follower ``MAX_LINE_CHARS`` of memory,
and each chunk is looked at once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubetune.executors.pods.ingest import MAX_SEQ
from kubetune.spec.results import RESULT_PREFIX, MetricError, Result, check_iteration, check_metrics

MAX_LINE_CHARS = 64 * 1024
RESERVED_KEYS = ("iteration", "checkpoint")


@dataclass(frozen=True)
class ResultLine:
    """A well-formed result line, as the body the push ingest accepts."""
    body: dict[str, Any]     # Result.to_wire() (spec/results.py), the push ingest's body

    @property
    def seq(self) -> int:
        return self.body["seq"]


@dataclass(frozen=True)
class MalformedLine:
    """A line that starts with the prefix but is not a result: reported, not recorded."""
    seq: int
    problem: str
    line: str


class LogLines:
    """Splits a log, chunk by chunk, into ``(line, overlong)`` pairs: linear time, and
    at most ``max_line_bytes`` held of a line however long it grows."""

    def __init__(self, max_line_bytes: int = MAX_LINE_CHARS) -> None:
        self._max = max_line_bytes
        self._pieces: list[bytes] = []
        self._size = 0
        self._overlong = False

    def feed(self, chunk: bytes) -> list[tuple[str, bool]]:
        lines = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._keep(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        self._keep(chunk[start:])
        return lines

    def finish(self) -> list[tuple[str, bool]]:
        """The last line, when the log does not end with a newline (the program ended)."""
        return [self._take()] if self._pieces or self._overlong else []

    def _keep(self, piece: bytes) -> None:
        room = self._max - self._size
        if len(piece) > room:
            self._overlong = True
            piece = piece[:room]
        if piece:
            self._pieces.append(piece)
            self._size += len(piece)

    def _take(self) -> tuple[str, bool]:
        line = (b"".join(self._pieces).decode("utf-8", "replace"), self._overlong)
        self._pieces, self._size, self._overlong = [], 0, False
        return line


class ResultLines:
    """Reads one attempt's log line by line, from its first line."""

    def __init__(self, first_seq: int, start_iteration: int, attempt: int | None) -> None:
        self._next_seq = first_seq
        self._iteration = start_iteration
        self._attempt = attempt

    def feed(self, line: str, overlong: bool = False) -> ResultLine | MalformedLine | None:
        """What one line of output is: a result, a malformed result line, or None (not ours).
        ``overlong``: the line was cut (LogLines), so it cannot be a result."""
        line = line.rstrip("\r\n")
        if not line.startswith(RESULT_PREFIX):
            return None
        rest = line[len(RESULT_PREFIX):]
        if rest and not rest[0].isspace():
            return None           # e.g. KUBETUNE_RESULTS: another word
        seq = self._next_seq
        self._next_seq += 1
        problem, fields = _fields(rest.strip(), MAX_LINE_CHARS + 1 if overlong else len(line))
        if problem:
            return MalformedLine(seq, problem, line[:200])
        iteration = fields.get("iteration", self._iteration + 1)
        if iteration > MAX_SEQ:
            # said (a MalformedLine is a Warning), and the lines after it still count from
            # the last iteration the ingest takes: one bad number must not drop the rest
            return MalformedLine(seq, f"iteration {iteration} is above {MAX_SEQ}", line[:200])
        self._iteration = iteration
        # no timestamp: the ingest stamps it when it takes the line
        body = Result(seq=seq, iteration=iteration, attempt=self._attempt, timestamp=None,
                      metrics={k: v for k, v in fields.items() if k not in RESERVED_KEYS},
                      checkpoint=fields.get("checkpoint")).to_wire()
        return ResultLine(body)


def _fields(text: str, length: int) -> tuple[str, dict[str, Any]]:
    """(why ``text`` is not a result or "", its fields)."""
    if length > MAX_LINE_CHARS:
        return f"longer than {MAX_LINE_CHARS} characters", {}
    if not text:
        return f'no JSON object after {RESULT_PREFIX} (expected e.g. {RESULT_PREFIX} {{"loss": 0.3}})', {}
    try:
        fields = json.loads(text)
    except ValueError as error:
        return f"not JSON: {error}", {}
    if not isinstance(fields, dict):
        return f"expected a JSON object of metrics, got {type(fields).__name__}", {}
    try:   # the checks every collector makes (NaN and Infinity are fine)
        if "iteration" in fields:
            check_iteration(fields["iteration"])
        check_metrics({k: v for k, v in fields.items() if k not in RESERVED_KEYS})
    except MetricError as error:
        return str(error), {}
    if fields.get("checkpoint") is not None and not isinstance(fields["checkpoint"], str):
        return "checkpoint must be a string (a location)", {}
    # a checkpoint alone is a result, as with kubetune.report({}, checkpoint=...)
    if not any(key not in RESERVED_KEYS for key in fields) and fields.get("checkpoint") is None:
        return "no metrics and no checkpoint", {}
    return "", fields
