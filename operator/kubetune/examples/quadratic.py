"""A quadratic bowl: the toy problem of the quickstart.

Parameters ``x`` and ``y`` (any real numbers; optimum at x=1, y=-2, loss 0).  Reports
``val_loss`` ``iterations`` times (default 5), approaching the bowl's value as if a
model were converging: ``bowl + 1/iteration``.  ``delay`` (seconds, default 0)
sleeps between reports, to look like training.  A trial given GPUs (``resources.gpu``:
Ray sets ``CUDA_VISIBLE_DEVICES`` for it) also reports ``gpus``, how many it sees.
"""
from __future__ import annotations

import os
import time

import kubetune


def bowl(x: float, y: float) -> float:
    return (x - 1.0) ** 2 + (y + 2.0) ** 2


def visible_gpus() -> int:
    """The GPUs this process may use: Ray names a trial's in ``CUDA_VISIBLE_DEVICES``."""
    return len([d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])


def train(config: dict) -> None:
    loss = bowl(float(config.get("x", 0.0)), float(config.get("y", 0.0)))
    delay = float(config.get("delay", 0.0))
    gpus = visible_gpus()
    for step in range(1, int(config.get("iterations", 5)) + 1):
        if delay:
            time.sleep(delay)
        # a CPU trial's results stay val_loss alone
        kubetune.report({"val_loss": loss + 1.0 / step, **({"gpus": gpus} if gpus else {})})
