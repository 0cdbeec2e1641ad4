"""A Tuner script using most of what kubetune convert raytune maps (tests/unit/test_convert_raytune.py)."""
import random

from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch


def train(config):
    tune.report({"loss": config["lr"]})


if __name__ == "__main__":
    tuner = tune.Tuner(
        tune.with_resources(train, {"cpu": 2, "gpu": 1}),
        param_space={
            "lr": tune.loguniform(1e-4, 1e-1),
            "momentum": tune.uniform(0.5, 0.99),
            "layers": tune.randint(1, 5),
            "width": tune.qrandint(32, 256, 32),
            "dropout": tune.quniform(0.0, 0.5, 0.1),
            "optimizer": tune.choice(["sgd", "adam"]),
            "seed": tune.sample_from(lambda spec: random.randint(0, 9)),
            "epochs": 3,
        },
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=12, time_budget_s=600,
            search_alg=ConcurrencyLimiter(OptunaSearch(seed=7), max_concurrent=3),
            scheduler=AsyncHyperBandScheduler(grace_period=2, max_t=27, reduction_factor=3)),
        run_config=tune.RunConfig(name="every_domain", stop={"training_iteration": 20},
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
                                  failure_config=tune.FailureConfig(max_failures=3)),
    )
    tuner.fit()
