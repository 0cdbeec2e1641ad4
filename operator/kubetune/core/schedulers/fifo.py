"""FIFO: run every trial to its end (maxIterations or its function returning)."""
from __future__ import annotations

from kubetune.core.schedulers.base import TrialScheduler


class FIFOScheduler(TrialScheduler):
    """The base behaviour, named: no early stopping, trials start in creation order."""
    name = "fifo"
    objectives = ("single", "multi")
