"""What the trials' failures say about the Experiment: the most common failure class
for its message, and whether the failures are systematic (every trial will fail the
same way, so launching the rest only wastes the budget).

A failure's class is the exception type that starts its message ("EntrypointError: ...",
"ZeroDivisionError: ...", "SystemExit: ...") or the reason a platform gave
("ImagePullBackOff: ...", a pod refused by Pod Security). Pure: no I/O.

The policy (README, troubleshooting):
- the entrypoint cannot be loaded (missing, not callable, raises on import), the trial
  pod is refused at creation (Pod Security, quota, admission) or its image cannot be
  pulled or its container configured: every trial shares the entrypoint and the pod
  template, so the first such failure is systematic;
- otherwise, when the first ``FIRST_TRIALS`` trials to end all failed with one class and
  none succeeded, the failure is systematic.
"""
from __future__ import annotations

import enum
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

FIRST_TRIALS = 3
ENTRYPOINT = "EntrypointError"
POD_REFUSED = "PodRefused"
# classes that every trial shares (the entrypoint; the pod template and its image): one
# failure is enough
SHARED_CAUSES = (ENTRYPOINT, POD_REFUSED, "InvalidImageName", "ErrImageNeverPull", "ErrImagePull",
                 "ImagePullBackOff", "CreateContainerConfigError")
EXAMPLE_CHARS = 300
OBJECTIVE_NOT_A_NUMBER = "ObjectiveNotANumber"


class FailureKind(str, enum.Enum):
    """Whose fault a failed call or a lost run is, as a platform classifies its errors
    (executors/platform.py).  The values are the kinds the results store records."""
    TRIAL = "Error"              # the trial's code, inputs or launch: counts toward maxFailures
    PLATFORM = "ClusterFault"    # the platform lost it (unreachable, node died): retried, not counted

_LEADING_TYPE = re.compile(r"^([A-Za-z_][\w.]*)(?=: |:$|$)")
_POD_REFUSED = re.compile(r"cannot create pod \S+: .*(forbidden|denied|exceeded quota|violates PodSecurity)",
                          re.IGNORECASE)


def failure_class(message: str) -> str:
    """The class of one trial failure, from its message."""
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    if _POD_REFUSED.search(first):
        return POD_REFUSED
    match = _LEADING_TYPE.match(first)
    if match:
        return match.group(1).rsplit(".", 1)[-1]
    # no type to name: the first words, without the trial-specific names and numbers
    return re.sub(r"\S*\d\S*", "#", first)[:60] or "unknown error"


def wrong_type(history: Iterable[Mapping[str, Any]], metric: str) -> str:
    """The failure message of a trial that reported ``metric`` only as a non-number
    (a string, a boolean, a list...); "" when it never reported it at all."""
    for metrics in reversed(list(history)):
        if metric in metrics and metrics[metric] is not None:
            value = metrics[metric]
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
            return (f"{OBJECTIVE_NOT_A_NUMBER}: {metric} was reported as a {type(value).__name__} ({shown}), "
                    f"not a number; report a float, e.g. kubetune.report({{{metric!r}: float(value)}})")
    return ""


def first_line(message: str) -> str:
    line = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    return line if len(line) <= EXAMPLE_CHARS else line[:EXAMPLE_CHARS] + "..."


@dataclass
class FailureTally:
    """The trials' terminal failures, in the order they ended."""
    first_trials: int = FIRST_TRIALS
    _failures: list[tuple[str, str, str]] = field(default_factory=list)   # (trial, class, message)
    _first: list[str | None] = field(default_factory=list)   # the first trials to end: class, None if not failed

    def failed(self, trial: str, message: str) -> None:
        kind = failure_class(message)
        self._failures.append((trial, kind, message))
        if len(self._first) < self.first_trials:
            self._first.append(kind)

    def ended_otherwise(self) -> None:
        """A trial ended without failing (succeeded, or stopped by a scheduler or budget)."""
        if len(self._first) < self.first_trials:
            self._first.append(None)

    @property
    def count(self) -> int:
        return len(self._failures)

    def most_common(self) -> tuple[str, int, str, str] | None:
        """(class, count, a trial, its first line) of the most frequent class; ties: the first seen."""
        if not self._failures:
            return None
        counts = Counter(kind for _, kind, _ in self._failures)   # insertion order breaks ties
        kind = max(counts, key=counts.__getitem__)
        trial, _, message = next(f for f in self._failures if f[1] == kind)
        return kind, counts[kind], trial, first_line(message)

    def most_often(self) -> str:
        """"most often ZeroDivisionError (2; exp-3: ZeroDivisionError: division by zero)"; "" if none."""
        common = self.most_common()
        if common is None:
            return ""
        kind, count, trial, line = common
        return f"most often {kind} ({count}; {trial}: {line})"

    def summary(self, created: int) -> str:
        """"2 of 8 trials failed, most often ..."; "" if none failed."""
        return f"{self.count} of {created} trials failed, {self.most_often()}" if self._failures else ""

    def systematic(self, max_trials: int) -> str:
        """Why the failures are systematic, or "" while they are not."""
        if not self._failures:
            return ""
        trial, kind, message = self._failures[-1]
        if kind in SHARED_CAUSES:
            what = {ENTRYPOINT: "the entrypoint cannot be loaded",
                    POD_REFUSED: "the trial pod is refused"}.get(kind, "the trial pod's container cannot start")
            return f"{what}, so every trial would fail the same way: {trial}: {first_line(message)}"
        first = min(self.first_trials, max_trials)
        if first >= 2 and len(self._first) >= first and len(set(self._first[:first])) == 1 \
                and self._first[0] is not None and len(self._failures) == first:
            return (f"the first {first} trials all failed with {kind}, and none succeeded: "
                    f"{trial}: {first_line(message)}")
        return ""
