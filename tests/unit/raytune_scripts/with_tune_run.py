"""The older entry point, tune.run (tests/unit/test_convert_raytune.py)."""
from ray import tune


def train(config):
    tune.report({"score": config["x"]})


if __name__ == "__main__":
    tune.run(train, config={"x": tune.grid_search([1, 2, 3])}, metric="score", mode="max",
             num_samples=2, stop={"training_iteration": 4}, max_failures=1)
