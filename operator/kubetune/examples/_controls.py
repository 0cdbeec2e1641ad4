"""What sleepy and resumable share: a gate a test opens, and reports that carry a
checkpoint (a directory holding ``state.json``) every N iterations or when a pause
asks for one."""
from __future__ import annotations

import json
import os
import tempfile
import time

import kubetune
from kubetune.trainable.api import get_context


def hold(gate: str) -> None:
    """Wait until the file ``gate`` exists, or until the trial is told to stop or pause."""
    while not os.path.exists(gate):
        context = get_context()
        if context.should_stop or context.should_checkpoint:
            return
        time.sleep(0.01)


def report(metrics: dict, state: dict, *, iteration: int, checkpoint_every: int) -> None:
    """Report ``metrics``, with a checkpoint holding ``state`` every ``checkpoint_every``
    iterations (0: never) and whenever a pause asks for one."""
    if (checkpoint_every and iteration % checkpoint_every == 0) or get_context().should_checkpoint:
        with tempfile.TemporaryDirectory() as checkpoint:
            with open(os.path.join(checkpoint, "state.json"), "w") as f:
                json.dump(state, f)
            kubetune.report(metrics, checkpoint=checkpoint)
    else:
        kubetune.report(metrics)
