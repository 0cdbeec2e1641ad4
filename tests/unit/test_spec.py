"""Experiment spec parsing: defaults, quantities, and user errors that name the field."""
import copy

import pytest

from kubetune.spec import SpecError, parse_duration, parse_experiment, parse_memory
from kubetune.core.schedulers import SCHEDULERS, scheduler_class

GOOD = {
    "objective": {"metric": "val_loss", "mode": "min", "goal": 0.05},
    "searchSpace": {
        "lr": {"loguniform": [1.0e-5, 1.0e-1]},
        "batch_size": {"choice": [32, 64, 128]},
        "layers": {"randint": [2, 8]},
        "dropout": {"uniform": [0.0, 0.5]},
        "width": {"quniform": [16, 256, 16]},
    },
    "search": {"algorithm": "tpe", "seed": 7},
    "scheduler": {"type": "asha", "maxIterations": 100, "gracePeriod": 1, "reductionFactor": 3},
    "budget": {"maxTrials": 64, "parallelism": 8, "maxFailedTrials": 3, "maxDuration": "2h"},
    "trial": {"entrypoint": "my_project.train:train", "resources": {"cpu": 2, "gpu": 1, "memory": "4Gi"},
              "maxFailures": 2, "runtimeEnv": {"pip": ["torch"]}, "config": {"epochs": 3}},
    "ray": {"address": "ray://raycluster-head-svc.ml:10001"},
    "suspend": False,
}


def test_full_spec_parses_with_snake_case_fields():
    spec = parse_experiment(GOOD)
    assert spec.objective.goal == 0.05 and spec.objective.mode == "min"
    assert spec.search_space["layers"].grid_values() == [2, 3, 4, 5, 6, 7]
    assert spec.search_space["width"].is_integer and spec.search_space["width"].grid_values()[-1] == 256
    assert spec.scheduler.max_iterations == 100 and spec.budget.max_duration_s == 7200
    assert spec.trial.resources.memory_bytes == 4 * 2**30 and spec.trial.resources.gpu == 1
    assert spec.ray.address == "ray://raycluster-head-svc.ml:10001"
    assert spec.trial.config == {"epochs": 3}


def test_minimal_spec_gets_contract_defaults():
    spec = parse_experiment({"objective": {"metric": "acc", "mode": "max"},
                             "searchSpace": {"x": {"uniform": [0, 1]}}, "trial": {"entrypoint": "a:b"}})
    assert (spec.search.algorithm, spec.scheduler.type, spec.executor) == ("random", "fifo", "ray")
    assert (spec.budget.max_trials, spec.budget.parallelism, spec.budget.max_failed_trials) == (10, 1, None)
    assert (spec.trial.resources.cpu, spec.trial.resources.bundles, spec.trial.max_failures) == (1.0, 1, 0)
    assert (spec.checkpoint.keep_last, spec.checkpoint.keep_best) == (2, 0)
    assert (spec.scheduler.grace_period, spec.scheduler.reduction_factor, spec.scheduler.perturbation_interval) == (1, 3, 5)


def test_pod_executor_needs_no_entrypoint():
    spec = parse_experiment({"objective": {"metric": "m", "mode": "min"}, "searchSpace": {"x": {"uniform": [0, 1]}},
                             "executor": "pod", "trial": {"template": {"spec": {"containers": [{"name": "t"}]}}}})
    assert spec.trial.entrypoint is None
    assert spec.trial.metrics_collector == "push"


def test_pod_trials_may_collect_metrics_from_stdout():
    spec = parse_experiment({"objective": {"metric": "m", "mode": "min"}, "searchSpace": {"x": {"uniform": [0, 1]}},
                             "executor": "pod", "trial": {"metricsCollector": "stdout",
                                                          "template": {"spec": {"containers": [{"name": "t"}]}}}})
    assert spec.trial.metrics_collector == "stdout"


@pytest.mark.parametrize("text,seconds", [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400),
                                          ("1d", 86400), (45, 45), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "90", "1x", "h", "-5s", "0s", "1h 30m", True])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text,n", [("2Gi", 2 * 2**30), ("500M", 500 * 10**6), (1024, 1024),
                                    ("1.5Gi", int(1.5 * 2**30)), ("512Ki", 512 * 1024), ("1e9", 10**9)])
def test_memory(text, n):
    assert parse_memory(text) == n


def _with(path, value):
    """GOOD with one field replaced (value None removes it)."""
    spec = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return spec


BAD = [
    # (field to change, new value, expected path, words the message must contain)
    ("objective", None, "spec.objective", "metric"),
    ("objective.mode", "minimize", "spec.objective.mode", "min or max"),
    ("objective.metric", "", "spec.objective.metric", "required"),
    ("searchSpace", {}, "spec.searchSpace", "at least one"),
    ("searchSpace.lr", {"loguniform": [0, 0.1]}, "spec.searchSpace.lr.loguniform", "low must be > 0 for a log scale (got 0)"),
    ("searchSpace.lr", {"uniform": [1, 0]}, "spec.searchSpace.lr.uniform", "low must be < high"),
    ("searchSpace.lr", {"uniform": [0, 1, 2]}, "spec.searchSpace.lr.uniform", "[low, high]"),
    ("searchSpace.lr", {"uniform": [0, 1], "choice": [1]}, "spec.searchSpace.lr", "exactly one"),
    ("searchSpace.lr", {"normal": [0, 1]}, "spec.searchSpace.lr.normal", "unknown distribution"),
    ("searchSpace.lr", {"quniform": [0, 1, 0]}, "spec.searchSpace.lr.quniform", "q (the step) must be > 0"),
    ("searchSpace.lr", {"randint": [0.5, 3]}, "spec.searchSpace.lr.randint", "integers"),
    ("searchSpace.lr", {"choice": []}, "spec.searchSpace.lr.choice", "non-empty"),
    ("searchSpace.lr", {"choice": [1, {"a": 1}]}, "spec.searchSpace.lr.choice", "numbers, strings or booleans"),
    ("searchSpace.lr", {"choice": ["a", "a"]}, "spec.searchSpace.lr.choice", "duplicate"),
    ("search.algorithm", "bayes", "spec.search.algorithm", "random, grid, tpe, cmaes, gp, qmc"),
    ("search.algorithm", "grid", "spec.searchSpace.lr.loguniform", "use choice, randint or quniform"),
    ("search.seed", "seven", "spec.search.seed", "integer"),
    ("scheduler.type", "bohb", "spec.scheduler.type", ", ".join(SCHEDULERS)),
    ("scheduler.maxIterations", None, "spec.scheduler.maxIterations", "required for asha"),
    ("scheduler.reductionFactor", 1, "spec.scheduler.reductionFactor", ">= 2"),
    ("scheduler.gracePeriod", 500, "spec.scheduler.gracePeriod", "<= maxIterations"),
    ("scheduler.quantileFraction", 0.75, "spec.scheduler.quantileFraction", "(0, 0.5]"),
    ("scheduler.resampleProbability", 2, "spec.scheduler.resampleProbability", "[0, 1]"),
    ("scheduler.maxIteration", 5, "spec.scheduler.maxIteration", "unknown field"),
    ("budget.maxTrials", 0, "spec.budget.maxTrials", ">= 1"),
    ("budget.parallelism", True, "spec.budget.parallelism", "integer"),
    ("budget.maxFailedTrials", -1, "spec.budget.maxFailedTrials", ">= 0"),
    ("budget.maxDuration", "2 hours", "spec.budget.maxDuration", "1h30m"),
    ("trial.entrypoint", None, "spec.trial.entrypoint", "package.module:function"),
    ("trial.entrypoint", "train.py", "spec.trial.entrypoint", "package.module:function"),
    ("trial.resources.cpu", -1, "spec.trial.resources.cpu", ">= 0"),
    ("trial.resources.memory", "2GB", "spec.trial.resources.memory", "2Gi"),
    ("trial.resources.bundles", 0, "spec.trial.resources.bundles", ">= 1"),
    ("trial.resources.custom", {"GPU": 1}, "spec.trial.resources.custom.GPU", "cpu, gpu and memory fields"),
    ("trial.maxFailures", -2, "spec.trial.maxFailures", ">= 0"),
    ("trial.queueTimeout", "soon", "spec.trial.queueTimeout", "duration"),
    ("trial.timeout", "soon", "spec.trial.timeout", "duration"),
    ("trial.timeout", "0s", "spec.trial.timeout", "positive"),
    ("trial.config", {"lr": 0.1}, "spec.trial.config.lr", "also in searchSpace"),
    ("trial.metricsCollector", "stdout", "spec.trial.metricsCollector", "set spec.executor: pod"),
    ("trial.metricsCollector", "stderr", "spec.trial.metricsCollector", "push, stdout"),
    ("checkpoint.keepLast", 0, "spec.checkpoint.keepLast", ">= 1"),
    ("checkpoint.deleteOnCompletion", "yes", "spec.checkpoint.deleteOnCompletion", "true or false"),
    ("ray.address", "http://head:8265", "spec.ray.address", "ray://host:port"),
    ("ray.tokenSecretRef", {"name": "ray", "key": "token"}, "spec.ray.tokenSecretRef", "ray.tokenSecretRef"),
    ("executor", "k8s", "spec.executor", "ray, pod"),
    ("suspend", "true", "spec.suspend", "true or false"),
    ("priority", 1.5, "spec.priority", "integer"),
    ("budgets", {}, "spec.budgets", "unknown field"),
]


@pytest.mark.parametrize("field,value,path,words", BAD, ids=[f"{b[0]}={b[1]!r}"[:60] for b in BAD])
def test_bad_spec_names_the_field(field, value, path, words):
    with pytest.raises(SpecError) as caught:   # what the operator checks of a spec (controller/intake.py)
        scheduler_class(parse_experiment(_with(field, value)))
    assert caught.value.path == path
    assert words in caught.value.message
    assert str(caught.value) == f"{path}: {caught.value.message}"


def test_grid_too_large_is_refused():
    spec = _with("search.algorithm", "grid")
    spec["searchSpace"] = {"a": {"quniform": [0, 1, 0.0001]}, "b": {"randint": [0, 100]}}
    with pytest.raises(SpecError) as caught:
        parse_experiment(spec)
    assert caught.value.path == "spec.searchSpace" and "points" in caught.value.message


def test_spec_must_be_an_object():
    with pytest.raises(SpecError) as caught:
        parse_experiment(["not", "a", "mapping"])
    assert caught.value.path == "spec"


@pytest.mark.parametrize("names,words", [
    ([True], "named true: kubectl reads YAML 1.1"),          # PyYAML's `on:`/`yes:`
    (["false"], "quote the key"),                              # kubectl's `n:`/`off:`
    ([""], "empty parameter name"),
    (["a.b", "a_b"], "KUBETUNE_PARAM_A_B: a.b and a_b"),
    (["lr", "LR"], "KUBETUNE_PARAM_LR: lr and LR"),
    (["hidden-size", "HIDDEN_SIZE"], "KUBETUNE_PARAM_HIDDEN_SIZE: hidden-size and HIDDEN_SIZE"),
    (["a b"], "letters, digits"),
    (["x" * 129], "at most 128"),
])
def test_parameter_names_are_checked_like_the_crd(names, words):
    spec = copy.deepcopy(GOOD)
    spec["searchSpace"] = {name: {"uniform": [0, 1]} for name in names}
    with pytest.raises(SpecError) as caught:
        parse_experiment(spec)
    assert caught.value.path.startswith("spec.searchSpace") and words in caught.value.message


def test_parameter_names_that_are_distinct_variables_are_accepted():
    spec = copy.deepcopy(GOOD)
    spec["searchSpace"] = {name: {"uniform": [0, 1]} for name in ["lr", "lr2", "model/depth", "y", "a.b"]}
    assert set(parse_experiment(spec).search_space) == {"lr", "lr2", "model/depth", "y", "a.b"}


def test_a_trial_key_is_composed_and_taken_apart_in_one_place():
    from kubetune.spec.trial_key import TrialKey
    key = TrialKey("ml", "mnist", "mnist-3")
    assert str(key) == "ml/mnist/mnist-3" and TrialKey.parse(str(key)) == key
    assert key.experiment_prefix == "ml/mnist/"
    for bad in ("ml/mnist", "ml/mnist/3/x", "ml//3", ""):
        with pytest.raises(ValueError, match="not a trial key"):
            TrialKey.parse(bad)


def test_search_algorithm_auto_resolves_to_a_sampler_and_says_why():
    from kubetune.spec import parse_experiment
    base = {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"x": {"uniform": [0, 1]}},
            "trial": {"entrypoint": "m:f"}, "search": {"algorithm": "auto"}}
    one = parse_experiment({**base, "budget": {"maxTrials": 64}, "scheduler": {"type": "hyperband", "maxIterations": 27}})
    assert (one.search.algorithm, one.search.auto) == ("tpe", "tpe with hyperband: one objective and 64 trials")
    # under ASHA, TPE trailed random search on the benchmark where the first rungs mislead it
    asha = parse_experiment({**base, "budget": {"maxTrials": 64}, "scheduler": {"type": "asha", "maxIterations": 27}})
    assert asha.search.algorithm == "random" and asha.search.auto.startswith("random with asha: one objective and 64")
    huge = parse_experiment({**base, "budget": {"maxTrials": 5000}})
    assert huge.search.algorithm == "random" and "5000 trials" in huge.search.auto
    two = {**base, "objective": None, "objectives": [{"metric": "a", "mode": "min"}, {"metric": "b", "mode": "min"}]}
    assert parse_experiment({**two, "budget": {"maxTrials": 500}}).search.algorithm == "nsgaii"
    assert parse_experiment({**two, "budget": {"maxTrials": 50}}).search.algorithm == "tpe"
    # 300 trials, the benchmark's multi-objective budget: MO-TPE beat NSGA-II there on DTLZ2
    small = parse_experiment({**two, "budget": {"maxTrials": 300}}).search
    assert small.algorithm == "tpe" and small.auto.startswith("tpe (multi-objective): 2 objectives and 300 trials")
    assert parse_experiment({**base, "search": {"algorithm": "tpe"}}).search.auto == ""
