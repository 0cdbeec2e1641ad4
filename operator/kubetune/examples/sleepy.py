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

import json
import os
import tempfile
import time

import kubetune
from kubetune.trainable.api import get_context


def _hold(gate: str) -> None:
    while not os.path.exists(gate):
        context = get_context()
        if context.should_stop or context.should_checkpoint:
            return
        time.sleep(0.01)


def train(config: dict) -> None:
    interval = float(config.get("interval", 0.05))
    hold_after = config.get("hold_after")
    every = int(config.get("checkpoint_every", 0))
    start = get_context().start_iteration
    for i in range(start + 1, int(config.get("iterations", 1000)) + 1):
        if hold_after is not None and i == int(hold_after) + 1:
            _hold(config["gate"])
        elif interval:
            time.sleep(interval)
        print(f"sleepy step {i}", flush=True)
        metrics = {"step": i, "pid": os.getpid()}
        if (every and i % every == 0) or get_context().should_checkpoint:
            with tempfile.TemporaryDirectory() as checkpoint:
                with open(os.path.join(checkpoint, "state.json"), "w") as f:
                    json.dump({"i": i}, f)
                kubetune.report(metrics, checkpoint=checkpoint)
        else:
            kubetune.report(metrics)
