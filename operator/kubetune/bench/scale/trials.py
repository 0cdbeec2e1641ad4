"""The trial function of the scale shapes: ``reports`` results at once, nothing else.

With ``runs_dir`` in its config, each run also leaves a file there named after its
trial (``<namespace>~<experiment>~<trial>~<random>``), written ``started`` when the run
begins and ``done`` after its last report: the ground truth of how often each trial
ran (``checks.runs_of``), independent of anything the operator writes."""
from __future__ import annotations

import os
import uuid

import kubetune

SEPARATOR = "~"     # never part of a Kubernetes name


def tick(config: dict) -> None:
    runs_dir = config.get("runs_dir")
    ledger = None
    if runs_dir:
        key = kubetune.get_context().trial_key.replace("/", SEPARATOR)
        ledger = os.path.join(runs_dir, f"{key}{SEPARATOR}{uuid.uuid4().hex}")
        with open(ledger, "w") as handle:
            handle.write("started")
    x = float(config.get("x", 0.0))
    for step in range(1, int(config.get("reports", 1)) + 1):
        kubetune.report({"loss": x + 1.0 / step})
    if ledger:
        with open(ledger, "w") as handle:
            handle.write("done")
