"""Ray Tune trainables written as a Ray Tune user writes them, for test_raytune_compat.py."""
from __future__ import annotations

import json
import os
import tempfile

import ray.air.session
import ray.train
from ray import tune


def every_spelling(config):
    tune.report({"loss": 3.0, "how": "ray.tune.report"})
    ray.train.report({"loss": 2.0, "how": "ray.train.report"})
    ray.air.session.report({"loss": 1.0, "how": "ray.air.session.report"})


def resumable(config):
    """Counts from its checkpoint: ``step`` in checkpoint.json, as Ray's examples do."""
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "checkpoint.json")) as f:
                step = json.load(f)["step"] + 1
    for current in range(step, config.get("steps", 3)):
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "checkpoint.json"), "w") as f:
                json.dump({"step": current}, f)
            tune.report({"step": current}, checkpoint=tune.Checkpoint.from_directory(directory))


def context(config):
    ctx = tune.get_context()
    tune.report({"trial_id_seen": ctx.get_trial_id(), "trial_name_seen": ctx.get_trial_name(),
                 "dir_exists": os.path.isdir(ctx.get_trial_dir()),
                 "cpus": ctx.get_trial_resources().required_resources.get("CPU", 0)})


def says_done(config):
    for i in range(100):
        tune.report({"i": i, "done": i == 2})


def with_data(config, data=None):
    tune.report({"total": sum(data)})


with_parameters = tune.with_parameters(with_data, data=[1, 2, 3])
with_resources = tune.with_resources(with_data, {"cpu": 1})


class Counter(tune.Trainable):
    """The class API: state in a dict checkpoint, ``done`` after ``stop_at``."""

    events: list = []       # what happened, in order, across instances (the test reads it)

    def setup(self, config):
        self.count = 0
        self.stop_at = config.get("stop_at", 4)
        Counter.events.append(("setup", dict(config)))

    def step(self):
        self.count += 1
        return {"count": self.count, "done": self.count >= self.stop_at}

    def save_checkpoint(self, checkpoint_dir):
        return {"count": self.count}

    def load_checkpoint(self, checkpoint):
        Counter.events.append(("load_checkpoint", checkpoint))
        self.count = checkpoint["count"]

    def cleanup(self):
        Counter.events.append(("cleanup",))
