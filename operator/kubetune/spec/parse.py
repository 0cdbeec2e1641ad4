"""Experiment CR ``spec`` dict -> ``ExperimentSpec``, or a ``SpecError`` naming the field.

The CRD schema rejects what it can at ``kubectl apply``; this catches the rest (and
everything when an Experiment file is run locally without a CRD). Every message says
what was wrong and what to write instead.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

from kubetune.spec.model import (
    ALGORITHMS, BUDGET_EXHAUSTED_ACTIONS, DISTRIBUTIONS, EXECUTORS, KUEUE_NAME, METRICS_COLLECTORS, Budget, CheckpointSpec, ExperimentSpec,
    PARAM_NAME, PARAM_REFERENCE, Objective, Param, RaySpec, SchedulerSpec, SearchSpec, SpecError,
    TrialResources, TrialTemplate, param_env_name,
)
from kubetune.spec import auto_search, objectives as objectives_spec
from kubetune.spec.quantities import parse_duration, parse_memory

# GridSampler materialises every combination; beyond this a grid is a typo, not a plan.
MAX_GRID_POINTS = 100_000
MAX_SEED = 2**32 - 1                # what Optuna's samplers (numpy) accept
MAX_CHOICE_TEXT = 256               # characters of one string choice (the CRD's maxLength)
MAX_CHOICES = 256                   # values of one choice (the CRD's maxItems)
# randint/quniform bounds and step counts: integers a float still holds exactly, so a
# range is computed on, never listed (Param.contains, grid_value), whatever its size
MAX_RANGE = 2 ** 53
# what one operator holds per Experiment: trials in flight (each a Trial object, an actor
# or pod, a ledger entry: see tests/integration/test_tenants.py) and trials in all
MAX_PARALLELISM = 1000
MAX_TRIALS = 100_000
# The CRD bounds each part of a search space (64 names, 256 choices each) but cannot see
# the total: choice values are untyped, and CRD rules do not reach them. A search space
# is refused above this size (search_space_size): at apply by the chart's
# ValidatingAdmissionPolicy (templates/search-space-size-policy.yaml, the same sum and
# limit), here for clusters without it and for `kubetune run`.
MAX_SEARCH_SPACE_SIZE = 128 * 1024

_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RAY_ADDRESS = re.compile(r"^(local|auto|ray://[^\s:/]+:\d+)$")
_RESERVED_RESOURCES = {"cpu", "gpu", "memory", "object_store_memory"}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(value: Any, path: str, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise SpecError(path, "required")
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, f"must be an object (got {type(value).__name__})")
    return value


def _only_keys(obj: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for key in obj:
        if key not in allowed:
            raise SpecError(f"{path}.{key}", f"unknown field; expected one of: {', '.join(allowed)}")


def _int(obj: Mapping[str, Any], key: str, path: str, default: int | None, minimum: int | None,
         maximum: int | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(f"{path}.{key}", f"must be an integer (got {value!r})")
    if minimum is not None and value < minimum:
        raise SpecError(f"{path}.{key}", f"must be >= {minimum} (got {value})")
    if maximum is not None and value > maximum:
        raise SpecError(f"{path}.{key}", f"must be <= {maximum} (got {value})")
    return value


def _number(obj: Mapping[str, Any], key: str, path: str, default: float | None, minimum: float | None = None) -> float | None:
    value = obj.get(key)
    if value is None:
        return default
    if not _is_number(value):
        raise SpecError(f"{path}.{key}", f"must be a finite number (got {value!r})")
    if minimum is not None and value < minimum:
        raise SpecError(f"{path}.{key}", f"must be >= {minimum:g} (got {value})")
    return float(value)


def _bool(obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false (got {value!r})")
    return value


def _string(obj: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str | None:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise SpecError(f"{path}.{key}", f"must be a non-empty string (got {value!r})")
    return value


def _one_of(obj: Mapping[str, Any], key: str, path: str, options: tuple[str, ...], default: str, what: str) -> str:
    value = obj.get(key, default)
    if value not in options:
        raise SpecError(f"{path}.{key}", f"unknown {what} {value!r}; use one of: {', '.join(options)}")
    return value


def _duration(obj: Mapping[str, Any], key: str, path: str) -> float | None:
    if obj.get(key) is None:
        return None
    try:
        return parse_duration(obj[key])
    except ValueError as exc:
        raise SpecError(f"{path}.{key}", str(exc)) from None


# ------------------------------------------------------------------ sections

def _objective(raw: Any) -> Objective:
    path = "spec.objective"
    if raw is None:
        raise SpecError(path, "required: add objective: {metric: <reported metric name>, mode: min|max}")
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("metric", "mode", "goal"))
    metric = obj.get("metric")
    if not isinstance(metric, str) or not metric:
        raise SpecError(f"{path}.metric", "required: the name of the metric your function reports, e.g. val_loss")
    if obj.get("mode") not in ("min", "max"):
        raise SpecError(f"{path}.mode", f"must be min or max (got {obj.get('mode')!r})")
    return Objective(metric=metric, mode=obj["mode"], goal=_number(obj, "goal", path, None))


def _bounds(values: Any, path: str, kind: str, count: int, shape: str) -> list[Any]:
    if not isinstance(values, list) or len(values) != count:
        got = f"{len(values)} values" if isinstance(values, list) else repr(values)
        raise SpecError(path, f"expected {shape} (got {got})")
    for value in values:
        if not _is_number(value):
            raise SpecError(path, f"bounds must be finite numbers (got {value!r})")
    if values[0] >= values[1]:
        raise SpecError(path, f"low must be < high (got low={values[0]}, high={values[1]})")
    return values


def _param(name: str, raw: Any) -> Param:
    path = f"spec.searchSpace.{name}"
    entry = _mapping(raw, path, required=True)
    kinds = [k for k in entry if k in DISTRIBUTIONS]
    unknown = [k for k in entry if k not in DISTRIBUTIONS]
    if unknown:
        raise SpecError(f"{path}.{unknown[0]}",
                        f"unknown distribution; use exactly one of: {', '.join(DISTRIBUTIONS)}")
    if len(kinds) != 1:
        got = ", ".join(kinds) if kinds else "none"
        raise SpecError(path, f"needs exactly one of {', '.join(DISTRIBUTIONS)} (got {got})")
    kind = kinds[0]
    values = entry[kind]
    path = f"{path}.{kind}"
    if kind == "uniform":
        low, high = _bounds(values, path, kind, 2, "[low, high]")
        return Param(kind, low=float(low), high=float(high))
    if kind == "loguniform":
        low, high = _bounds(values, path, kind, 2, "[low, high]")
        if low <= 0:
            raise SpecError(path, f"low must be > 0 for a log scale (got {low})")
        return Param(kind, low=float(low), high=float(high))
    if kind == "quniform":
        if isinstance(values, list) and len(values) == 3 and _is_number(values[2]) and values[2] <= 0:
            raise SpecError(path, f"q (the step) must be > 0 (got {values[2]})")
        low, high, q = _bounds(values, path, kind, 3, "[low, high, q]")
        _within_range(path, low, high)
        if q > high - low:
            raise SpecError(path, f"q (the step) must be <= high - low (got q={q}, high - low={high - low})")
        if (high - low) / q > MAX_RANGE:
            raise SpecError(path, f"has {(high - low) / q:.3g} steps of q (at most 2^53); use a larger q or uniform")
        if all(isinstance(v, int) for v in (low, high, q)):
            return Param(kind, low=low, high=high, q=q)
        return Param(kind, low=float(low), high=float(high), q=float(q))
    if kind == "randint":
        low, high = _bounds(values, path, kind, 2, "[low, high) with high exclusive")
        if not all(isinstance(v, int) or float(v).is_integer() for v in (low, high)):
            raise SpecError(path, f"bounds must be integers (got {values})")
        _within_range(path, low, high)
        return Param(kind, low=int(low), high=int(high))
    # choice
    if not isinstance(values, list) or not values:
        raise SpecError(path, "expected a non-empty list of values, e.g. [32, 64, 128]")
    if len(values) > MAX_CHOICES:
        raise SpecError(path, f"has {len(values)} values (at most {MAX_CHOICES}); sample from a range "
                              "(randint, quniform, uniform) instead")
    seen: list[Any] = []
    for value in values:
        if not (isinstance(value, (str, bool)) or _is_number(value)):
            raise SpecError(path, f"values must be numbers, strings or booleans (got {value!r})")
        if isinstance(value, str) and len(value) > MAX_CHOICE_TEXT:
            raise SpecError(path, f"a string value has {len(value)} characters (at most {MAX_CHOICE_TEXT})")
        # 1 == True in Python; compare with the type so [1, true] is not a duplicate.
        if any(type(v) is type(value) and v == value for v in seen):
            raise SpecError(path, f"duplicate value {value!r}")
        seen.append(value)
    return Param(kind, choices=tuple(values))


def _within_range(path: str, low: float, high: float) -> None:
    if not -MAX_RANGE <= low < high <= MAX_RANGE:
        raise SpecError(path, f"bounds must be within [-2^53, 2^53] (got [{low:g}, {high:g}])")


def search_space_size(space: Mapping[str, Any]) -> int:
    """What the size limit counts: per parameter its name's length + 32, and the length of
    each choice string (8 per number or boolean). Not the JSON length: the admission
    policy computes this same sum in CEL, which has no JSON encoder."""
    total = 0
    for name, entry in space.items():
        total += len(str(name)) + 32
        choices = entry.get("choice") if isinstance(entry, Mapping) else None
        if isinstance(choices, list):
            total += sum(len(value) if isinstance(value, str) else 8 for value in choices)
    return total


def _search_space(raw: Any) -> dict[str, Param]:
    path = "spec.searchSpace"
    space = _mapping(raw, path)
    if not space:
        raise SpecError(path, "required: at least one parameter, e.g. lr: {loguniform: [1.0e-5, 1.0e-1]}")
    _parameter_names(list(space))
    size = search_space_size(space)
    if size > MAX_SEARCH_SPACE_SIZE:
        raise SpecError(path, f"is too large: {size // 1024} KiB (at most {MAX_SEARCH_SPACE_SIZE // 1024} KiB, "
                              "counting each parameter name and choice string); sample from ranges "
                              "(uniform, randint, quniform) instead of listing values")
    return {str(name): _param(str(name), entry) for name, entry in space.items()}


YAML11_BOOLEAN_KEY = ("kubectl reads YAML 1.1, where an unquoted key y, n, yes, no, on or off is a boolean; "
                      "quote the key, e.g. \"y\": {uniform: [-5, 5]}")


def _parameter_names(names: list[Any]) -> None:
    """The CRD's rules on ``searchSpace`` keys, for files run without a CRD."""
    path = "spec.searchSpace"
    seen: dict[str, str] = {}
    for name in names:
        # PyYAML turns yes/no/on/off (not y/n) into booleans; kubectl sends them as "true"/"false"
        if isinstance(name, bool) or name in ("true", "false"):
            raise SpecError(path, f"has a parameter named {str(name).lower()}: {YAML11_BOOLEAN_KEY}")
        name = str(name)
        if not name:
            raise SpecError(path, "has an empty parameter name")
        if not PARAM_NAME.match(name):
            raise SpecError(f"{path}.{name}", "a parameter name has at most 128 characters, letters, digits and "
                                              "_ . - / : (each name is also an environment variable of pod trials)")
        env = param_env_name(name)
        if env in seen:
            raise SpecError(path, f"has parameter names that are one environment variable of a pod trial, {env}: "
                                  f"{seen[env]} and {name}; rename one of them (each name is upper-cased, "
                                  "with . - / : as _)")
        seen[env] = name


def _search(raw: Any, space: Mapping[str, Param]) -> SearchSpec:
    path = "spec.search"
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("algorithm", "seed", "initialPoints"))
    algorithm = _one_of(obj, "algorithm", path, ALGORITHMS, "random", "algorithm")
    seed = _int(obj, "seed", path, None, 0, MAX_SEED)
    if algorithm == "grid":
        points = 1
        for name, param in space.items():
            size = param.grid_size()
            if size is None:
                raise SpecError(f"spec.searchSpace.{name}.{param.kind}",
                                "grid search needs a finite set of values: use choice, randint or "
                                "quniform for this parameter, or another search.algorithm")
            points *= size
            if points > MAX_GRID_POINTS:
                break
        if points > MAX_GRID_POINTS:
            raise SpecError("spec.searchSpace",
                            f"the grid has {points} points (at most {MAX_GRID_POINTS}); "
                            "use fewer values or search.algorithm random/tpe")
    return SearchSpec(algorithm=algorithm, seed=seed,
                      initial_points=objectives_spec.initial_points(obj.get("initialPoints"), space))


def _scheduler(raw: Any) -> SchedulerSpec:
    path = "spec.scheduler"
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("type", "maxIterations", "gracePeriod", "reductionFactor",
                           "perturbationInterval", "quantileFraction", "resampleProbability"))
    # which names exist, and what each needs, is the schedulers' own (core.schedulers.scheduler_class)
    kind = _string(obj, "type", path, "fifo")
    max_iterations = _int(obj, "maxIterations", path, None, 1)
    grace = _int(obj, "gracePeriod", path, 1, 1)
    if max_iterations is not None and grace > max_iterations:
        raise SpecError(f"{path}.gracePeriod", f"must be <= maxIterations ({max_iterations}) (got {grace})")
    quantile = _number(obj, "quantileFraction", path, 0.25)
    if not 0 < quantile <= 0.5:
        raise SpecError(f"{path}.quantileFraction", f"must be in (0, 0.5] (got {quantile})")
    resample = _number(obj, "resampleProbability", path, 0.25)
    if not 0 <= resample <= 1:
        raise SpecError(f"{path}.resampleProbability", f"must be in [0, 1] (got {resample})")
    return SchedulerSpec(
        type=kind, max_iterations=max_iterations, grace_period=grace,
        reduction_factor=_int(obj, "reductionFactor", path, 3, 2),
        perturbation_interval=_int(obj, "perturbationInterval", path, 5, 1),
        quantile_fraction=quantile, resample_probability=resample,
    )


def _budget(raw: Any) -> Budget:
    path = "spec.budget"
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("maxTrials", "parallelism", "maxFailedTrials", "maxDuration", "admissionWindow",
                           "gpuHours", "cpuHours", "onExhausted"))
    return Budget(
        max_trials=_int(obj, "maxTrials", path, 10, 1, MAX_TRIALS),
        parallelism=_int(obj, "parallelism", path, 1, 1, MAX_PARALLELISM),
        max_failed_trials=_int(obj, "maxFailedTrials", path, None, 0),
        max_duration_s=_duration(obj, "maxDuration", path),
        admission_window=_int(obj, "admissionWindow", path, 4, 1),
        gpu_hours=_number(obj, "gpuHours", path, None, 0.0),
        cpu_hours=_number(obj, "cpuHours", path, None, 0.0),
        on_exhausted=_one_of(obj, "onExhausted", path, BUDGET_EXHAUSTED_ACTIONS, "stop", "action"),
    )


def _resources(raw: Any) -> TrialResources:
    path = "spec.trial.resources"
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("cpu", "gpu", "memory", "custom", "bundles"))
    memory = None
    if obj.get("memory") is not None:
        try:
            memory = parse_memory(obj["memory"])
        except ValueError as exc:
            raise SpecError(f"{path}.memory", str(exc)) from None
    custom: dict[str, float] = {}
    for name, amount in _mapping(obj.get("custom"), f"{path}.custom").items():
        if str(name).lower() in _RESERVED_RESOURCES:
            raise SpecError(f"{path}.custom.{name}", "use the cpu, gpu and memory fields for these")
        if not _is_number(amount) or amount < 0:
            raise SpecError(f"{path}.custom.{name}", f"must be a number >= 0 (got {amount!r})")
        custom[str(name)] = float(amount)
    return TrialResources(
        cpu=_number(obj, "cpu", path, 1.0, 0.0), gpu=_number(obj, "gpu", path, 0.0, 0.0),
        memory=float(memory or 0), custom=custom, bundles=_int(obj, "bundles", path, 1, 1),
    )


def _trial(raw: Any, executor: str, space: Mapping[str, Param]) -> TrialTemplate:
    path = "spec.trial"
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("entrypoint", "resources", "maxFailures", "queueTimeout", "timeout", "runtimeEnv", "config",
                           "template", "metricsCollector", "expectedIterationSeconds"))
    entrypoint = _string(obj, "entrypoint", path)
    if entrypoint is None and executor == "ray":
        raise SpecError(f"{path}.entrypoint", "required for the ray executor: the function to tune, "
                                              "as \"package.module:function\"")
    if entrypoint is not None and not _ENTRYPOINT.match(entrypoint):
        raise SpecError(f"{path}.entrypoint", f"expected \"package.module:function\" (got {entrypoint!r})")
    config = dict(_mapping(obj.get("config"), f"{path}.config"))
    for key in config:
        if key in space:
            raise SpecError(f"{path}.config.{key}", "is also in searchSpace, where the sampled value would "
                                                    "always win; remove it from one of them")
    resources = _resources(obj.get("resources"))
    return TrialTemplate(
        entrypoint=entrypoint, resources=resources,
        max_failures=_int(obj, "maxFailures", path, 0, 0),
        queue_timeout_s=_duration(obj, "queueTimeout", path),
        timeout_s=_duration(obj, "timeout", path),
        runtime_env=dict(_mapping(obj.get("runtimeEnv"), f"{path}.runtimeEnv")), config=config,
        template=_pod_template(obj.get("template"), executor, resources, [*space, *config]),
        metrics_collector=_metrics_collector(obj, executor),
        expected_iteration_seconds=_number(obj, "expectedIterationSeconds", path, None, 0.0),
    )


def _metrics_collector(obj: Mapping[str, Any], executor: str) -> str:
    """``spec.trial.metricsCollector``: how a trial pod's results reach the operator."""
    collector = _one_of(obj, "metricsCollector", "spec.trial", METRICS_COLLECTORS, "push", "metrics collector")
    if collector != "push" and executor != "pod":
        raise SpecError("spec.trial.metricsCollector", f"{collector} applies to the pod executor only (Ray trials "
                                                       "report with kubetune.report); set spec.executor: pod "
                                                       "or remove trial.metricsCollector")
    return collector


def _pod_template(raw: Any, executor: str, resources: TrialResources, names: list[str]) -> dict | None:
    """``spec.trial.template``: a PodTemplateSpec, for (and only for) the pod executor.
    The API server validates the pod itself when it is created; this checks what is ours."""
    path = "spec.trial.template"
    if executor != "pod":
        if raw is not None:
            raise SpecError(path, "only the pod executor runs a pod template; set spec.executor: pod "
                                  "(or remove the template and name a function in spec.trial.entrypoint)")
        return None
    if raw is None:
        raise SpecError(path, "required for the pod executor: the PodTemplateSpec ({metadata, spec}) "
                              "of the pod that runs one trial")
    template = _mapping(raw, path)
    containers = _mapping(template.get("spec"), f"{path}.spec").get("containers")
    if not isinstance(containers, list) or not containers:
        raise SpecError(f"{path}.spec.containers", "required for the pod executor: at least one container; "
                                                   "the first one runs the trial")
    if resources.bundles > 1:
        raise SpecError("spec.trial.resources.bundles", "a pod trial is one pod: bundles > 1 needs the ray executor")
    if not float(resources.gpu).is_integer():
        raise SpecError("spec.trial.resources.gpu", f"{resources.gpu:g} is not a whole number; "
                                                    "Kubernetes schedules whole GPUs")
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(_mapping(template.get("spec"), f"{path}.spec").get(kind) or []):
            where = f"{path}.spec.{kind}[{index}]"
            container = _mapping(container, where)
            for field in ("command", "args"):
                for position, item in enumerate(container.get(field) or []):
                    for match in PARAM_REFERENCE.finditer(str(item)):
                        if match.group(1) not in names:
                            raise SpecError(f"{where}.{field}[{position}]",
                                            f"${{params.{match.group(1)}}} names no parameter of searchSpace "
                                            f"or trial.config (known: {', '.join(sorted(names)) or 'none'})")
    return dict(template)


def _checkpoint(raw: Any) -> CheckpointSpec:
    path = "spec.checkpoint"
    obj = _mapping(raw, path)
    _only_keys(obj, path, ("storage", "keepLast", "keepBest", "deleteOnCompletion"))
    return CheckpointSpec(
        storage=_string(obj, "storage", path), keep_last=_int(obj, "keepLast", path, 2, 1),
        keep_best=_int(obj, "keepBest", path, 0, 0),
        delete_on_completion=_bool(obj, "deleteOnCompletion", path, False),
    )


def _ray(raw: Any) -> RaySpec:
    path = "spec.ray"
    obj = _mapping(raw, path)
    if "tokenSecretRef" in obj:   # an earlier field, never used: say where the token comes from
        raise SpecError(f"{path}.tokenSecretRef", "not an Experiment field: the Ray auth token is the "
                        "operator's (Helm value ray.tokenSecretRef, the RAY_AUTH_TOKEN of its pod)")
    _only_keys(obj, path, ("address",))
    address = _string(obj, "address", path)
    if address is not None and not _RAY_ADDRESS.match(address):
        raise SpecError(f"{path}.address", f"expected local, auto or ray://host:port (got {address!r})")
    return RaySpec(address=address)


TOP_LEVEL = ("objective", "objectives", "constraints", "warmStart", "searchSpace", "search", "scheduler",
             "budget", "trial", "checkpoint", "ray", "executor", "priority", "suspend", "queue", "priorityClass")


# The CRD's maxLength / maxItems / maxProperties, for files run without a CRD (`kubetune
# run`): path under spec -> the most characters, items or keys.  The lower bounds are
# the sections' own "required" checks.  tests/unit/test_crd_matches_spec.py keeps this
# table and the CRD equal.
MAX_SIZES = {
    "objective.metric": 256, "objectives": 8, "constraints": 16, "warmStart.experiments": 16,
    "searchSpace": 64, "search.initialPoints": 256, "budget.maxDuration": 32, "trial.entrypoint": 512,
    "trial.resources.custom": 32, "trial.queueTimeout": 32, "trial.timeout": 32, "ray.address": 512,
    "queue": 63, "priorityClass": 63,
}


def _max_sizes(root: Mapping[str, Any]) -> None:
    for path, most in MAX_SIZES.items():
        value: Any = root
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        if isinstance(value, (str, list, Mapping)) and len(value) > most:
            unit = "characters" if isinstance(value, str) else "items" if isinstance(value, list) else "keys"
            raise SpecError(f"spec.{path}", f"has {len(value)} {unit} (at most {most})")


def parse_experiment(spec: Any) -> ExperimentSpec:
    """Validate and parse an Experiment's ``spec``; raises ``SpecError`` on the first problem."""
    root = _mapping(spec, "spec", required=True)
    _only_keys(root, "spec", TOP_LEVEL)
    _max_sizes(root)
    objectives, reference_point = objectives_spec.objectives(root, _objective)
    space = _search_space(root.get("searchSpace"))
    search = _search(root.get("search"), space)
    scheduler = _scheduler(root.get("scheduler"))
    budget = _budget(root.get("budget"))
    if search.algorithm == "auto":
        chosen, why = auto_search.choose(objectives=len(objectives), max_trials=budget.max_trials,
                                         early_stopping=None if scheduler.type == "fifo" else scheduler.type)
        search = dataclasses.replace(search, algorithm=chosen, auto=why)
    objectives_spec.check_multi_objective(len(objectives), search.algorithm)
    executor = _one_of(root, "executor", "spec", EXECUTORS, "ray", "executor")
    return ExperimentSpec(
        objective=objectives[0], objectives=objectives, reference_point=reference_point,
        constraints=objectives_spec.constraints(root.get("constraints")),
        warm_start=objectives_spec.warm_start(root.get("warmStart")),
        search_space=space, search=search, scheduler=scheduler, budget=budget,
        trial=_trial(root.get("trial"), executor, space), checkpoint=_checkpoint(root.get("checkpoint")),
        ray=_ray(root.get("ray")), executor=executor,
        priority=_int(root, "priority", "spec", 0, -2**31, 2**31 - 1), suspend=_bool(root, "suspend", "spec", False),
        queue=_kueue_name(root, "queue", executor), priority_class=_kueue_name(root, "priorityClass", executor),
    )


def _kueue_name(root: Mapping[str, Any], key: str, executor: str) -> str | None:
    """spec.queue / spec.priorityClass: Kueue names, which reach Kueue as label values."""
    value = _string(root, key, "spec")
    if value is None:
        return None
    if executor != "pod":
        raise SpecError(f"spec.{key}", "Kueue admits pod trials only; set spec.executor: pod")
    if not KUEUE_NAME.match(value):
        raise SpecError(f"spec.{key}", f"must be a lowercase name of at most 63 characters "
                                       f"(a-z, 0-9, '-', '.'; got {value!r})")
    return value
