"""A slow, controllable trainable for tests of stop, pause, logs and re-attach.

Config (all optional):
- ``iterations`` (default 1000) reports of ``{"step": i, "pid": <process id>}``;
- ``interval``: seconds between reports (default 0.05);
- ``hold_after`` and ``gate``: after ``hold_after`` reports (0: before the first),
  wait until the file ``gate`` exists, or until the trial is told to stop or pause;
  a test decides when the trial may go on;
- ``checkpoint_every``: checkpoint every N iterations (0: only when a pause asks
  for one, through ``get_context().should_checkpoint``);
- prints ``sleepy step <i>`` before each report.
"""
from __future__ import annotations

import os
import time

from kubetune.examples._controls import hold, report
from kubetune.trainable.api import get_context


def train(config: dict) -> None:
    interval = float(config.get("interval", 0.05))
    hold_after = config.get("hold_after")
    every = int(config.get("checkpoint_every", 0))
    start = get_context().start_iteration
    for i in range(start + 1, int(config.get("iterations", 1000)) + 1):
        if hold_after is not None and i == int(hold_after) + 1:
            hold(config["gate"])
        elif interval:
            time.sleep(interval)
        print(f"sleepy step {i}", flush=True)
        report({"step": i, "pid": os.getpid()}, {"i": i}, iteration=i, checkpoint_every=every)
