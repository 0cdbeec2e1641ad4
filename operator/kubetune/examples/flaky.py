"""Fails once, then resumes from its checkpoint: the retry example.

Reports ``iterations`` times (default 10) ``{"score": i, "val_loss": 1/i}`` with a
checkpoint every iteration (a directory holding ``state.json`` with ``i``).  On its
first attempt it raises ``RuntimeError`` right after reporting iteration
``fail_at`` (default 5); a retry resumes from the checkpoint, so the reported
history has no gap and no duplicate.  ``fail_at: 0`` never fails.
"""
from __future__ import annotations

import json
import os
import tempfile

import kubetune
from kubetune.trainable.api import get_context


def train(config: dict) -> None:
    iterations = int(config.get("iterations", 10))
    fail_at = int(config.get("fail_at", 5))
    done = 0
    restored = kubetune.get_checkpoint()
    if restored is not None:
        with open(os.path.join(restored, "state.json")) as f:
            done = json.load(f)["i"]
    first_attempt = get_context().attempt == 0
    for i in range(done + 1, iterations + 1):
        with tempfile.TemporaryDirectory() as checkpoint:
            with open(os.path.join(checkpoint, "state.json"), "w") as f:
                json.dump({"i": i}, f)
            kubetune.report({"score": i, "val_loss": 1.0 / i}, checkpoint=checkpoint)
        if first_attempt and i == fail_at:
            raise RuntimeError(f"flaky failure after iteration {i}")
