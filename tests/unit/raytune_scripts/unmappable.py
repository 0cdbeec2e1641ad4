"""A Tuner script with what has no kubetune equivalent (tests/unit/test_convert_raytune.py)."""
import numpy as np

from ray import tune
from ray.tune.schedulers import FIFOScheduler


class MyScheduler(FIFOScheduler):
    pass


def train(config):
    tune.report({"loss": 1.0})


if __name__ == "__main__":
    tune.Tuner(
        train,
        param_space={
            "a": tune.sample_from(lambda spec: spec.config.b * np.random.rand()),
            "b": tune.randn(0, 1),
        },
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=MyScheduler()),
        run_config=tune.RunConfig(stop={"mean_accuracy": 0.9}),
    ).fit()
