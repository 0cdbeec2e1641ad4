"""When the results writer's thread removes the stored results of finished Experiments
older than ``retention_s`` (the operator's ``--results-retention-days``): once an hour,
the first pass at once.  A deleted Experiment's rows go at once (writer.py)."""
from __future__ import annotations

import logging
import math
from typing import Callable

from kubetune.results.store import ResultsStore

log = logging.getLogger(__name__)

FINISHED_PHASES = ("Succeeded", "Failed")
RETENTION_INTERVAL_S = 3600.0


class Retention:
    def __init__(self, retention_s: float, clock: Callable[[], float]) -> None:
        self.retention_s = retention_s     # 0: keep everything
        self._clock = clock
        self._at = -math.inf               # the last pass (or the last failed one)

    def due_in(self) -> float | None:
        """Seconds until the next pass is due (at most 0: now); None: never."""
        return None if self.retention_s <= 0 else self._at + RETENTION_INTERVAL_S - self._clock()

    def is_due(self) -> bool:
        due = self.due_in()
        return due is not None and due <= 0

    def run_if_due(self, store: ResultsStore) -> None:
        """One pass if it is due; what the store raises is the caller's."""
        if not self.is_due():
            return
        removed = store.delete_finished_before(self._clock() - self.retention_s, FINISHED_PHASES)
        self._at = self._clock()
        if removed:
            log.info("results store: retention removed %d results of finished experiments", removed)

    def skip(self) -> None:
        """A pass failed for a reason waiting will not cure: the next in an interval."""
        self._at = self._clock()
