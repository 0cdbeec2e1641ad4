"""A trial that records when it runs, for tests of how many trials run at once.

Parameter ``x``; reports ``loss`` = (x - 0.3)^2 + 1/step ``iterations`` times (default
20), ``interval`` seconds apart (default 0.1).  Before each report it writes
``{"start": ..., "alive": ...}`` (epoch seconds) to a file of its own in
``record_dir``: a run the operator failed to stop keeps extending its ``alive``.
"""
from __future__ import annotations

import json
import os
import time

import kubetune


def train(config: dict) -> None:
    x = float(config["x"])
    interval = float(config.get("interval", 0.1))
    context = kubetune.get_context()
    record = os.path.join(config["record_dir"], f"{context.trial_name}-{context.attempt}-{os.getpid()}.json")
    started = time.time()
    for step in range(context.start_iteration + 1, int(config.get("iterations", 20)) + 1):
        time.sleep(interval)
        with open(record, "w") as handle:
            json.dump({"start": started, "alive": time.time()}, handle)
        kubetune.report({"loss": (x - 0.3) ** 2 + 1.0 / step})
