"""Experiment.status.usage to the Prometheus counters (metrics.py), as increments.

The first usage seen is the baseline, not an increment: a restarted operator restores
what its predecessor already counted (and exported), and a counter that jumped by the
whole total at start would make ``increase()`` count it twice."""
from __future__ import annotations

from typing import Mapping

from kubetune import metrics


class UsageCounters:
    def __init__(self, namespace: str, experiment: str) -> None:
        self.namespace, self.experiment = namespace, experiment
        self._exported: dict[str, float] | None = None

    def export(self, usage: Mapping[str, float] | None) -> None:
        if usage is None:
            return
        current = {key: float(usage.get(key, 0.0)) for key in metrics.USAGE_SECONDS}
        if self._exported is not None:
            metrics.usage_counted(self.namespace, self.experiment,
                                  {key: current[key] - self._exported[key] for key in current})
        self._exported = current
