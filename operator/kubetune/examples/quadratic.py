"""A quadratic bowl: the toy problem of the quickstart.

Parameters ``x`` and ``y`` (any real numbers; optimum at x=1, y=-2, loss 0).  Reports
``val_loss`` ``iterations`` times (default 5), approaching the bowl's value as if a
model were converging: ``bowl + 1/iteration``.  ``delay`` (seconds, default 0)
sleeps between reports, to look like training.
"""
from __future__ import annotations

import time

import kubetune


def bowl(x: float, y: float) -> float:
    return (x - 1.0) ** 2 + (y + 2.0) ** 2


def train(config: dict) -> None:
    loss = bowl(float(config.get("x", 0.0)), float(config.get("y", 0.0)))
    delay = float(config.get("delay", 0.0))
    for step in range(1, int(config.get("iterations", 5)) + 1):
        if delay:
            time.sleep(delay)
        kubetune.report({"val_loss": loss + 1.0 / step})
