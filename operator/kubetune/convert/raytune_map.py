"""What a Ray Tune script was about to tune (raytune_capture.Captured) as a kubetune
Experiment.  Each Ray construct maps to its kubetune field, or is refused by name
with the line it came from; approximations are said in notes."""
from __future__ import annotations

import datetime
import inspect
import math
import os
from typing import Any

from kubetune.convert import raytune_space
from kubetune.convert.common import API_VERSION, Conversion, dns_name
from kubetune.convert.raytune_capture import ARGUMENTS, WRAPPED, Captured

DEFAULT_PARALLELISM = 4          # Ray runs as many trials as fit; kubetune needs a number
SEARCHERS = {"OptunaSearch": "tpe", "HyperOptSearch": "tpe", "BasicVariantGenerator": "random",
             "BayesOptSearch": "gp"}
TIME_ATTRS = ("training_iteration", None)


def to_experiment(c: Captured) -> tuple[dict[str, Any], Conversion]:
    conv = Conversion(source=f"{os.path.basename(c.script)} ({c.via} at {c.line})")
    spec: dict[str, Any] = {}
    trial = _trial(c, conv)
    tune = _tune_settings(c)
    run = _run_settings(c)
    objectives = _objectives(c, tune, conv)
    search = _search(tune["search_alg"], c, conv, spec, objectives)
    _scheduler(tune["scheduler"], run, c, conv, spec, objectives)
    if objectives:
        if len(objectives) == 1:
            spec["objective"] = objectives[0]
        else:
            spec["objectives"] = objectives
    else:
        conv.refuse("no metric", c.line, "neither TuneConfig nor the search algorithm or scheduler names "
                    "a metric and mode; kubetune needs an objective: set TuneConfig(metric=..., mode=...)")
    space, constants, grid_size = raytune_space.param_space(c.param_space, c, conv, spec.get("scheduler", {}).get("type"))
    space.update(spec.pop("_mutations", {}))
    for name in space:
        constants.pop(name, None)
    spec["searchSpace"] = space
    if search:
        spec["search"] = search
    if grid_size and spec.get("search", {}).get("algorithm", "random") in ("random", "grid"):
        if all("choice" in p for p in space.values()) and raytune_space.all_grid(c.param_space):
            spec["search"] = {**spec.get("search", {}), "algorithm": "grid"}
    num_samples = int(tune["num_samples"])
    if num_samples < 1:
        conv.refuse(f"num_samples={num_samples}", c.line, "kubetune needs a trial budget: set num_samples >= 1")
    max_trials = num_samples * (grid_size or 1)
    budget: dict[str, Any] = {"maxTrials": max_trials}
    parallelism = search.pop("_parallelism", None) if search else None
    parallelism = tune["max_concurrent_trials"] or parallelism
    if not parallelism:
        parallelism = min(max_trials, DEFAULT_PARALLELISM)
        conv.note(f"Ray runs as many trials at once as resources allow; budget.parallelism is set to {parallelism}")
    budget["parallelism"] = min(int(parallelism), max_trials) or 1
    if tune["time_budget_s"]:
        seconds = tune["time_budget_s"]
        seconds = seconds.total_seconds() if isinstance(seconds, datetime.timedelta) else float(seconds)
        budget["maxDuration"] = f"{int(math.ceil(seconds))}s"
    spec["budget"] = budget
    _run_config(run, c, conv, spec, trial, constants)
    if constants:
        trial["config"] = {**constants, **trial.get("config", {})}
    spec["trial"] = trial
    name = run["name"] or getattr(c.trainable, "__name__", "") or "experiment"
    body = {"apiVersion": API_VERSION, "kind": "Experiment", "metadata": {"name": dns_name(name)},
            "spec": _ordered(spec)}
    return body, conv


def _ordered(spec: dict) -> dict:
    order = ("objective", "objectives", "searchSpace", "search", "scheduler", "budget", "trial", "checkpoint")
    return {**{k: spec[k] for k in order if k in spec}, **{k: v for k, v in spec.items() if k not in order}}


# ---------------------------------------------------------------- the trainable

def _module_of_script(script: str) -> str:
    """The dotted module name the script is importable as: its package chain (directories
    with ``__init__.py``) above it, else its file name alone."""
    directory, stem = os.path.split(os.path.splitext(script)[0])
    parts = [stem]
    while os.path.exists(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    return ".".join(parts)


def _trial(c: Captured, conv: Conversion) -> dict[str, Any]:
    """The entrypoint: the outermost name the script's module binds the trainable to (a
    module-level ``tune.with_parameters`` object too), else the function or class itself;
    ``tune.with_resources`` gives the trial's resources."""
    trial: dict[str, Any] = {}
    module = _module_of_script(c.script)
    target, resources, entry = c.trainable, None, None
    while True:
        if entry is None:
            name = next((k for k, v in c.script_globals.items() if v is target and not k.startswith("_")), None)
            entry = f"{module}:{name}" if name else None
        wrapped = (getattr(target, "__dict__", None) or {}).get(WRAPPED)
        if wrapped is None:
            break
        kind, inner, arguments, where = wrapped
        if kind == "with_resources":
            resources = resources if resources is not None else (arguments, where)
        elif arguments and entry is None:
            conv.refuse(f"tune.with_parameters(..., {', '.join(arguments)}=...)", where,
                        "the objects it passes are made by the script, which a trial does not run; "
                        "define the wrapped trainable at module level, or load the data inside the function")
        if inner is target:
            break
        target = inner
    if entry is None:
        qualname, owner = getattr(target, "__qualname__", ""), getattr(target, "__module__", "")
        if isinstance(target, str) or not qualname or "<" in qualname:
            conv.refuse(repr(target)[:80], c.line, "the trainable must be a function or tune.Trainable "
                        "class defined at the top level of a module, so a trial can import it")
            return trial
        entry = f"{module if owner == '__main__' else owner}:{qualname}"
    trial["entrypoint"] = entry
    if entry.split(":")[0] == os.path.splitext(os.path.basename(c.script))[0]:
        conv.note(f"the trials import {entry.split(':')[0]}: put {os.path.dirname(c.script)} on their "
                  "PYTHONPATH (the image, or spec.trial.runtimeEnv working_dir)")
    trial["resources"] = _resources(resources, c, conv)
    if inspect.isclass(c.trainable):
        trial["_class"] = True
    return trial


def _resources(resources: tuple[Any, str] | None, c: Captured, conv: Conversion) -> dict[str, Any]:
    if resources is None:
        return {"cpu": 1}           # Ray's default for a trial
    value, where = resources
    bundles = getattr(value, "bundles", None)
    if bundles is not None:
        if len(bundles) != 1:
            conv.refuse("a PlacementGroupFactory of several bundles", where,
                        "a kubetune trial is one process: give one bundle")
            return {"cpu": 1}
        value = bundles[0]
    if not isinstance(value, dict):
        conv.refuse("tune.with_resources(<callable>)", where, "resources that depend on the config have "
                    "no kubetune equivalent; give a dict")
        return {"cpu": 1}
    out: dict[str, Any] = {}
    for key, amount in value.items():
        name = {"cpu": "cpu", "gpu": "gpu", "memory": "memory"}.get(str(key).lower())
        if name is None:
            conv.refuse(f"resource {key!r}", where, "kubetune trials ask for cpu, gpu and memory")
        elif amount:
            out[name] = amount
    return out or {"cpu": 1}


# ---------------------------------------------------------------- TuneConfig / tune.run

def _tune_settings(c: Captured) -> dict[str, Any]:
    config, kwargs = c.tune_config, c.run_kwargs
    names = ("metric", "mode", "search_alg", "scheduler", "num_samples", "max_concurrent_trials",
             "time_budget_s")
    settings = {n: getattr(config, n, None) if config is not None else kwargs.get(n) for n in names}
    settings["num_samples"] = settings["num_samples"] if settings["num_samples"] is not None else 1
    return settings


def _run_settings(c: Captured) -> dict[str, Any]:
    run, kwargs = c.run_config, c.run_kwargs
    if c.via == "tune.run":
        return {"name": kwargs.get("name"), "stop": kwargs.get("stop"), "storage_path": kwargs.get("storage_path"),
                "num_to_keep": kwargs.get("keep_checkpoints_num"),
                "score_attribute": kwargs.get("checkpoint_score_attr"),
                "checkpoint_frequency": kwargs.get("checkpoint_freq") or 0,
                "checkpoint_at_end": kwargs.get("checkpoint_at_end"),
                "max_failures": kwargs.get("max_failures") or 0}
    checkpoint = getattr(run, "checkpoint_config", None)
    failure = getattr(run, "failure_config", None)
    return {"name": getattr(run, "name", None), "stop": getattr(run, "stop", None),
            "storage_path": getattr(run, "storage_path", None),
            "num_to_keep": getattr(checkpoint, "num_to_keep", None),
            "score_attribute": getattr(checkpoint, "checkpoint_score_attribute", None),
            "checkpoint_frequency": getattr(checkpoint, "checkpoint_frequency", 0) or 0,
            "checkpoint_at_end": getattr(checkpoint, "checkpoint_at_end", None),
            "max_failures": getattr(failure, "max_failures", 0) or 0}


def _arguments(obj: Any) -> dict[str, Any]:
    return dict(getattr(obj, ARGUMENTS, None) or {})


def _objectives(c: Captured, tune: dict, conv: Conversion) -> list[dict[str, str]]:
    metric, mode = tune["metric"], tune["mode"]
    for obj in (tune["search_alg"], tune["scheduler"]):
        inner = obj
        while inner is not None and type(inner).__name__ in ("ConcurrencyLimiter", "Repeater"):
            inner = _arguments(inner).get("searcher")
        args = _arguments(inner)
        if metric is None and args.get("metric") is not None:
            metric, mode = args["metric"], args.get("mode")
    if metric is None:
        return []
    metrics = metric if isinstance(metric, (list, tuple)) else [metric]
    modes = mode if isinstance(mode, (list, tuple)) else [mode] * len(metrics)
    if any(m not in ("min", "max") for m in modes):
        conv.refuse(f"mode={mode!r}", c.line, "say mode='min' or 'max' for each metric")
        return []
    return [{"metric": m, "mode": d} for m, d in zip(metrics, modes)]


# ---------------------------------------------------------------- search algorithm

def _search(searcher: Any, c: Captured, conv: Conversion, spec: dict, objectives: list) -> dict[str, Any]:
    search: dict[str, Any] = {}
    while searcher is not None and type(searcher).__name__ in ("ConcurrencyLimiter", "Repeater"):
        args = _arguments(searcher)
        if type(searcher).__name__ == "Repeater":
            conv.refuse("Repeater", args.get("_line", c.line), "kubetune runs each configuration once")
        elif args.get("max_concurrent"):
            search["_parallelism"] = int(args["max_concurrent"])
        searcher = args.get("searcher")
    if searcher is None:
        return search
    kind = type(searcher).__name__
    args = _arguments(searcher)
    where = args.get("_line", c.line)
    algorithm = SEARCHERS.get(kind)
    if algorithm is None:
        conv.refuse(kind, where, f"no kubetune search algorithm matches it; kubetune has random, grid, tpe, "
                    "cmaes, gp, qmc and nsgaii (Optuna's samplers)")
        return search
    if kind == "OptunaSearch" and args.get("sampler") is not None:
        sampler = type(args["sampler"]).__name__
        algorithm = {"TPESampler": "tpe", "CmaEsSampler": "cmaes", "RandomSampler": "random",
                     "GPSampler": "gp", "QMCSampler": "qmc", "NSGAIISampler": "nsgaii"}.get(sampler)
        if algorithm is None:
            conv.refuse(f"OptunaSearch(sampler={sampler}())", where, "no kubetune algorithm is that sampler")
            return search
    if kind == "OptunaSearch" and callable(args.get("space")) and not isinstance(args.get("space"), dict):
        conv.refuse("OptunaSearch(space=<define-by-run function>)", where,
                    "kubetune's searchSpace is declared, not defined by running code; declare it in param_space")
    elif kind in ("OptunaSearch", "HyperOptSearch", "BayesOptSearch") and args.get("space"):
        conv.refuse(f"{kind}(space=...)", where, "declare the search space in param_space (tune.uniform, ...)")
    if len(objectives) > 1 and algorithm == "tpe":
        conv.note("several objectives: Optuna's TPE sampler handles them (kubetune: search.algorithm tpe)")
    search["algorithm"] = algorithm
    seed = args.get("seed") if kind != "BasicVariantGenerator" else args.get("random_state")
    if isinstance(seed, int):
        search["seed"] = seed
    points = args.get("points_to_evaluate")
    if points:
        search["initialPoints"] = [dict(p) for p in points]
    return search


# ---------------------------------------------------------------- scheduler and stop

def _scheduler(scheduler: Any, run: dict, c: Captured, conv: Conversion, spec: dict, objectives: list) -> None:
    stop_iterations = _stop(run["stop"], c, conv)
    out: dict[str, Any] = {}
    if scheduler is not None:
        kind = type(scheduler).__name__
        args = _arguments(scheduler)
        where = args.get("_line", c.line)
        time_attr = args.get("time_attr", "training_iteration")
        if kind in ("AsyncHyperBandScheduler", "HyperBandScheduler", "MedianStoppingRule",
                    "PopulationBasedTraining") and time_attr not in TIME_ATTRS:
            conv.refuse(f"{kind}(time_attr={time_attr!r})", where,
                        "kubetune schedulers count reported iterations: use time_attr='training_iteration'")
        if kind == "FIFOScheduler":
            pass
        elif kind == "AsyncHyperBandScheduler":
            out = {"type": "asha", "maxIterations": int(args.get("max_t", 100)),
                   "gracePeriod": int(args.get("grace_period", 1)),
                   "reductionFactor": int(args.get("reduction_factor", 4))}
            if int(args.get("brackets", 1)) != 1:
                conv.note(f"ASHA brackets={args['brackets']}: kubetune's ASHA has one bracket")
        elif kind == "HyperBandScheduler":
            out = {"type": "hyperband", "maxIterations": int(args.get("max_t", 81)),
                   "reductionFactor": int(args.get("reduction_factor", 3))}
        elif kind == "MedianStoppingRule":
            out = {"type": "median", "gracePeriod": max(int(args.get("grace_period", 1) or 1), 1)}
            if args.get("min_samples_required", 3) != 3:
                conv.note("MedianStoppingRule(min_samples_required=...): kubetune's median rule uses its own minimum")
        elif kind == "PopulationBasedTraining":
            out = {"type": "pbt", "perturbationInterval": max(int(args.get("perturbation_interval", 5)), 1),
                   "quantileFraction": float(args.get("quantile_fraction", 0.25)),
                   "resampleProbability": float(args.get("resample_probability", 0.25))}
            if args.get("custom_explore_fn") is not None:
                conv.refuse("PopulationBasedTraining(custom_explore_fn=...)", where,
                            "kubetune's PBT perturbs within the searchSpace; a custom explore function has no equivalent")
            if tuple(args.get("perturbation_factors", (1.2, 0.8))) not in ((1.2, 0.8), (0.8, 1.2)):
                conv.note("PBT perturbation_factors: kubetune perturbs by 0.8 or 1.2")
            spec["_mutations"] = raytune_space.mutations(args.get("hyperparam_mutations") or {}, where, conv)
            if not spec["_mutations"]:
                conv.refuse("PopulationBasedTraining without hyperparam_mutations", where,
                            "name the parameters PBT may change (they become the searchSpace)")
        else:
            conv.refuse(kind, where, "no kubetune scheduler matches it; kubetune has fifo, asha, hyperband, "
                        "median, percentile and pbt")
    if stop_iterations is not None:
        current = out.get("maxIterations")
        out["maxIterations"] = min(current, stop_iterations) if current else stop_iterations
    if out.get("gracePeriod") and out.get("maxIterations") and out["gracePeriod"] > out["maxIterations"]:
        out["gracePeriod"] = out["maxIterations"]
    if out:
        spec["scheduler"] = {"type": out.pop("type", "fifo"), **out}


def _stop(stop: Any, c: Captured, conv: Conversion) -> int | None:
    if stop is None:
        return None
    if not isinstance(stop, dict):
        conv.refuse(f"stop={type(stop).__name__}", c.line, "a Stopper or stop function has no kubetune "
                    "equivalent; use stop={'training_iteration': N}")
        return None
    iterations = None
    for key, value in stop.items():
        if key == "training_iteration":
            iterations = int(value)
        elif key == "done" and value is True:
            pass             # a result with done: True ends its trial (trainable/raytune.py)
        else:
            conv.refuse(f"stop={{{key!r}: {value!r}}}", c.line,
                        "kubetune stops a trial at spec.scheduler.maxIterations, or the whole Experiment "
                        "at objective.goal; a per-trial stop on another metric has no equivalent")
    return iterations


# ---------------------------------------------------------------- RunConfig

def _ray_default_storage() -> str:
    """Where RunConfig puts results when storage_path is not given (it fills the field in)."""
    return os.path.abspath(os.path.expanduser(os.environ.get("RAY_STORAGE") or "~/ray_results"))


def _run_config(run: dict, c: Captured, conv: Conversion, spec: dict, trial: dict, constants: dict) -> None:
    is_class = trial.pop("_class", False)
    checkpoint: dict[str, Any] = {}
    if run["num_to_keep"]:
        if run["score_attribute"]:
            checkpoint.update(keepBest=int(run["num_to_keep"]), keepLast=1)
            if run["score_attribute"] not in [o["metric"] for o in spec.get("objectives") or [spec.get("objective") or {}]]:
                conv.note(f"checkpoint_score_attribute={run['score_attribute']!r}: kubetune's keepBest ranks "
                          "checkpoints by the objective metric")
        else:
            checkpoint["keepLast"] = int(run["num_to_keep"])
    storage = run["storage_path"]
    if storage and os.path.abspath(os.path.expanduser(str(storage))) != _ray_default_storage():
        conv.note("checkpoint.storage is RunConfig's storage_path: trials on a cluster need a shared one "
                  "(s3://, gs://, or a volume every trial mounts)")
        checkpoint["storage"] = str(storage)
    if checkpoint:
        spec["checkpoint"] = checkpoint
    if run["max_failures"]:
        if int(run["max_failures"]) < 0:
            conv.refuse("FailureConfig(max_failures=-1)", c.line, "kubetune retries a trial a bounded number "
                        "of times: give a number")
        else:
            trial["maxFailures"] = int(run["max_failures"])
    if is_class:
        frequency = int(run["checkpoint_frequency"] or 0)
        trial["config"] = {"__checkpoint_frequency__": frequency or 1}
        if frequency == 0:
            conv.note("a tune.Trainable class checkpoints every iteration under kubetune unless "
                      "CheckpointConfig(checkpoint_frequency=N) says otherwise (PBT exploits the latest)")
        if run["checkpoint_at_end"] is False:
            trial["config"]["__checkpoint_at_end__"] = False
    elif run["checkpoint_frequency"]:
        conv.note("checkpoint_frequency applies to tune.Trainable classes; a function checkpoints when it reports one")
