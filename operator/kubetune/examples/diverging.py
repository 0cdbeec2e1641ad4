"""Training that diverges for large learning rates, and a chatty trial.

Parameter ``lr`` (> 0).  Reports five metrics per iteration, ``iterations`` times
(default 6), as fast as it can: ``loss`` (the objective), ``accuracy``,
``grad_norm``, ``lr`` and ``phase`` (a string).  With ``lr`` above ``diverge_above``
(default 0.5) the run diverges from iteration ``diverge_from`` (default 2) on: ``loss`` cycles through NaN,
Infinity and -Infinity and ``grad_norm`` is Infinity, as a real exploding run
reports them.  ``delay`` (seconds, default 0) sleeps between reports.  Used by the
tests of non-finite values and of 30,000-result trials.
"""
from __future__ import annotations

import math
import time

import kubetune

DIVERGED = (math.nan, math.inf, -math.inf)


def train(config: dict) -> None:
    lr = float(config["lr"])
    diverges = lr > float(config.get("diverge_above", 0.5))
    delay = float(config.get("delay", 0.0))
    for step in range(1, int(config.get("iterations", 6)) + 1):
        if delay:
            time.sleep(delay)
        if diverges and step >= int(config.get("diverge_from", 2)):
            loss, grad_norm = DIVERGED[step % 3], math.inf
        else:
            loss, grad_norm = (lr - 0.1) ** 2 + 1.0 / step, 1.0 / step
        kubetune.report({"loss": loss, "accuracy": 1.0 - 1.0 / (step + 1), "grad_norm": grad_norm,
                         "lr": lr, "phase": "warmup" if step < 3 else "train"})
