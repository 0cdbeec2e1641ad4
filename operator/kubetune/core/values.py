"""What a non-finite objective means (NaN, +-Infinity: accepted from every collector,
see spec/results.py).

It is the worst value there is: it is never a trial's or the experiment's best, never
reaches the goal, ranks last for PBT, and schedulers and the study see it as NaN,
which Optuna's pruners treat as diverged (successive halving stops it at its next
rung; the median rule stops a trial that has no finite value at a milestone).
"""
from __future__ import annotations

import math


def is_finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def judged(value: float) -> float:
    """The objective as schedulers and the study see it: any non-finite value is NaN,
    the one value Optuna treats as diverged (an -Infinity loss must not look best)."""
    return value if math.isfinite(value) else math.nan
