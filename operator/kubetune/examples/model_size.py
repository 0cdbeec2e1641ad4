"""Loss against model size: the toy problem of ``examples/multi-objective.yaml``.

A "model" of ``width`` units in each of ``depth`` layers, trained with learning rate
``lr``. Bigger models reach a lower loss but cost parameters and memory, so no single
configuration is best: the answer is a Pareto front. Each report gives ``loss`` (the
curve ``floor + gap / iteration``), ``model_size`` (parameters, millions) and
``memory_gb`` (what a constraint bounds). ``delay`` seconds between reports.
"""
from __future__ import annotations

import math
import time

import kubetune


def model_size(width: int, depth: int) -> float:
    return width * width * depth / 1e6


def final_loss(lr: float, width: int, depth: int) -> float:
    capacity = math.log2(width * depth)
    return 2.0 / capacity + 0.3 * (math.log10(lr) + 2.5) ** 2


def train(config: dict) -> None:
    lr, width, depth = float(config["lr"]), int(config["width"]), int(config["depth"])
    size = model_size(width, depth)
    floor = final_loss(lr, width, depth)
    delay = float(config.get("delay", 0.0))
    for step in range(1, int(config.get("iterations", 5)) + 1):
        if delay:
            time.sleep(delay)
        kubetune.report({"loss": floor + 1.0 / step, "model_size": size, "memory_gb": 0.5 + 4.0 * size})
