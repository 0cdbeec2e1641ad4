"""What the results store keeps, as plain values (no SQLAlchemy in the signatures)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from kubetune.core.types import Result


@dataclass(frozen=True)
class ExperimentRow:
    uid: str                 # metadata.uid: a re-created Experiment of the same name is another row
    namespace: str
    name: str
    metric: str = ""         # the objective
    mode: str = ""           # min | max
    phase: str = ""
    created: float = 0.0     # epoch seconds, first seen
    study: str = ""          # JSON: objectives, constraints, distributions (schema.py); "" if unknown


@dataclass(frozen=True)
class TrialRow:
    uid: str
    experiment_uid: str
    name: str
    index: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    phase: str = ""
    reason: str = ""
    best: float | None = None     # the objective's best value (never NaN)
    iteration: int | None = None
    attempt: int = 0


@dataclass(frozen=True)
class ResultRow:
    """One ``kubetune.report(...)``.  ``metrics`` values are numbers (NaN and ±Infinity
    included, kept as they are), strings, booleans; anything else is kept as JSON text."""
    trial_uid: str
    seq: int
    iteration: int
    metrics: Mapping[str, Any]
    time: float = 0.0
    attempt: int | None = None
    checkpoint: str | None = None

    @classmethod
    def of(cls, trial_uid: str, result: "Result") -> "ResultRow":
        """The row of one ``Result`` as a trial reported it (spec/results.py)."""
        return cls(trial_uid, result.seq, result.iteration, dict(result.metrics), result.timestamp, result.attempt,
                   result.checkpoint)


@dataclass(frozen=True)
class FailureRow:
    """A failed attempt with its whole error (the Trial resource keeps only a capped tail)."""
    trial_uid: str
    attempt: int
    reason: str
    message: str
    time: float = 0.0


@dataclass(frozen=True)
class UsageRow:
    """What one attempt of a trial used (core/usage.py), on the trial host's clock."""
    trial_uid: str
    attempt: int
    started: float
    ended: float | None        # None while it runs (``seen`` is the latest time known)
    seen: float
    run_seconds: float
    gpu_seconds: float
    cpu_seconds: float
    queue_seconds: float = 0.0


@dataclass
class Batch:
    """One write: upserted in one transaction, so a batch is stored whole or not at all."""
    experiments: list[ExperimentRow] = field(default_factory=list)
    trials: list[TrialRow] = field(default_factory=list)
    results: list[ResultRow] = field(default_factory=list)
    failures: list[FailureRow] = field(default_factory=list)
    usage: list[UsageRow] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.experiments) + len(self.trials) + len(self.results) + len(self.failures) + len(self.usage)

    def extend(self, other: "Batch") -> None:
        self.experiments += other.experiments
        self.trials += other.trials
        self.results += other.results
        self.failures += other.failures
        self.usage += other.usage
