"""What a reported result may hold, checked where results enter kubetune
(``kubetune.report`` in a Ray trial, the push ingest, the stdout collector), so a bad
value is the trial's error, told to the trial with the metric's name, and never
reaches a write to the API server:

- a metric is a number (int, float; bool counts as 0/1) or a string;
- NaN and +-Infinity are accepted and kept as they are (a diverging learning rate is
  the most common result in tuning): see core/values.py for what they mean and
  core/sanitize.py for how Kubernetes gets them;
- an integer outside int64 is refused (the API server and every database store int64);
- anything else (None, lists, dicts, objects) is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_METRIC_NAME = 256
MAX_METRICS = 1000           # per result
# one result's JSON, on either platform: what report() takes in a Ray trial
# (trainable/function_runner.py) and the pod ingest's body limit (executors/pods/ingest.py)
MAX_RESULT_BYTES = 1 << 20
# what starts a result line in a trial pod's log (metricsCollector: stdout): written by
# trainable/pod_session.py, read by executors/pods/stdout_results.py
RESULT_PREFIX = "KUBETUNE_RESULT"


class MetricError(ValueError):
    """A reported result kubetune cannot take; the message names the metric and the fix."""


def check_metric(name: str, value: Any) -> int | float | str:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise MetricError(f"metric {name!r} is {value}, outside the 64-bit integer range; "
                              "report it as a float or a string")
        return value
    if isinstance(value, (float, str)):
        return value
    raise MetricError(f"metric {name!r} is a {type(value).__name__}; report numbers or strings "
                      "(one metric per name, e.g. {'loss': 0.3, 'phase': 'warmup'})")


def check_metrics(metrics: Any) -> dict[str, int | float | str]:
    """The metrics dict of one result, checked; raises ``MetricError``."""
    if not isinstance(metrics, Mapping):
        raise MetricError(f"metrics must be a dict of name -> number or string, got {type(metrics).__name__}")
    if len(metrics) > MAX_METRICS:
        raise MetricError(f"{len(metrics)} metrics in one result; at most {MAX_METRICS}")
    checked = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key or len(key) > MAX_METRIC_NAME:
            raise MetricError(f"metric name {str(key)[:80]!r}: must be a non-empty string of at most "
                              f"{MAX_METRIC_NAME} characters")
        checked[key] = check_metric(key, value)
    return checked


def check_iteration(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT64_MAX:
        raise MetricError(f"iteration must be an integer >= 1 and at most {INT64_MAX} (int64), got {value!r}")
    return value


@dataclass(frozen=True)
class Result:
    """One ``kubetune.report(...)`` as delivered by an executor.

    ``seq`` increases by one per report within a trial's lifetime (across retries),
    so a result is processed once however often it is fetched.
    ``iteration`` is 1-based and continues across retries and pauses.
    """
    seq: int
    iteration: int
    metrics: Mapping[str, Any]
    timestamp: float
    checkpoint: str | None = None
    # Which launch of the trial produced it (LaunchTrial.attempt); None = unknown. Lets the
    # runner drop a late result of a run it already paused or restarted.
    attempt: int | None = None

    # The one wire format of a result, between a trial and the operator, produced and
    # read here only: trainable/function_runner.py (a Ray trial, returned to the driver),
    # trainable/pod_session.py (a trial pod's push) and executors/pods/stdout_results.py
    # (a result line of a pod's log) produce it; executors/ray/checked.py and the push
    # ingest (executors/pods/ingest.py, after its checks) read it.
    def to_wire(self) -> dict[str, Any]:
        return {"seq": self.seq, "iteration": self.iteration, "metrics": dict(self.metrics),
                "timestamp": self.timestamp, "checkpoint": self.checkpoint, "attempt": self.attempt}

    @classmethod
    def from_wire(cls, body: Mapping[str, Any], *, attempt: int | None = None,
                  now: float | None = None) -> "Result":
        """``body`` as a Result; ``attempt`` when the body has none (a Ray trial's batch
        carries it once), ``now`` (the reader's clock) when it has no timestamp."""
        timestamp = body.get("timestamp")
        return cls(seq=body["seq"], iteration=body["iteration"], metrics=body["metrics"],
                   timestamp=timestamp if timestamp is not None else now,
                   checkpoint=body.get("checkpoint"),
                   attempt=body["attempt"] if body.get("attempt") is not None else attempt)
