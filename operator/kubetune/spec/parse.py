"""Experiment CR ``spec`` dict -> ``ExperimentSpec``, or a ``SpecError`` naming the field.

The CRD schema rejects what it can at ``kubectl apply``; this catches the rest (and
everything when an Experiment file is run locally without a CRD). Every message says
what was wrong and what to write instead.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from kubetune.spec.model import (
    ALGORITHMS, BUDGET_EXHAUSTED_ACTIONS, EXECUTORS, KUEUE_NAME, METRICS_COLLECTORS, Budget, CheckpointSpec, ExperimentSpec,
    PARAM_REFERENCE, Objective, Param, RaySpec, SchedulerSpec, SearchSpec, SpecError,
    TrialResources, TrialTemplate,
)
from kubetune.spec import auto_search, objectives as objectives_spec
from kubetune.spec.fields import boolean, duration, integer, is_number, mapping, number, one_of, only_keys, string
from kubetune.spec.quantities import parse_memory
from kubetune.spec.search_space import search_space

# GridSampler materialises every combination; beyond this a grid is a typo, not a plan.
MAX_GRID_POINTS = 100_000
MAX_SEED = 2**32 - 1                # what Optuna's samplers (numpy) accept
# what one operator holds per Experiment: trials in flight (each a Trial object, an actor
# or pod, a ledger entry: tests/integration/test_tenants.py queues 1,000) and trials in all
# (10,000 one-result trials in one Experiment beside 200 others: BENCHMARKS.md, issue 26)
MAX_PARALLELISM = 1000
MAX_TRIALS = 10_000
_ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_RAY_ADDRESS = re.compile(r"^(local|auto|ray://[^\s:/]+:\d+)$")
_RESERVED_RESOURCES = {"cpu", "gpu", "memory", "object_store_memory"}


def _objective(raw: Any) -> Objective:
    path = "spec.objective"
    if raw is None:
        raise SpecError(path, "required: add objective: {metric: <reported metric name>, mode: min|max}")
    obj = mapping(raw, path)
    only_keys(obj, path, ("metric", "mode", "goal"))
    metric = obj.get("metric")
    if not isinstance(metric, str) or not metric:
        raise SpecError(f"{path}.metric", "required: the name of the metric your function reports, e.g. val_loss")
    if obj.get("mode") not in ("min", "max"):
        raise SpecError(f"{path}.mode", f"must be min or max (got {obj.get('mode')!r})")
    return Objective(metric=metric, mode=obj["mode"], goal=number(obj, "goal", path, None))


def _search(raw: Any, space: Mapping[str, Param]) -> SearchSpec:
    path = "spec.search"
    obj = mapping(raw, path)
    only_keys(obj, path, ("algorithm", "seed", "initialPoints"))
    algorithm = one_of(obj, "algorithm", path, ALGORITHMS, "random", "algorithm")
    seed = integer(obj, "seed", path, None, 0, MAX_SEED)
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
    obj = mapping(raw, path)
    only_keys(obj, path, ("type", "maxIterations", "gracePeriod", "reductionFactor",
                           "perturbationInterval", "quantileFraction", "resampleProbability"))
    # which names exist, and what each needs, is the schedulers' own (core.schedulers.scheduler_class)
    kind = string(obj, "type", path, "fifo")
    max_iterations = integer(obj, "maxIterations", path, None, 1)
    grace = integer(obj, "gracePeriod", path, 1, 1)
    if max_iterations is not None and grace > max_iterations:
        raise SpecError(f"{path}.gracePeriod", f"must be <= maxIterations ({max_iterations}) (got {grace})")
    quantile = number(obj, "quantileFraction", path, 0.25)
    if not 0 < quantile <= 0.5:
        raise SpecError(f"{path}.quantileFraction", f"must be in (0, 0.5] (got {quantile})")
    resample = number(obj, "resampleProbability", path, 0.25)
    if not 0 <= resample <= 1:
        raise SpecError(f"{path}.resampleProbability", f"must be in [0, 1] (got {resample})")
    return SchedulerSpec(
        type=kind, max_iterations=max_iterations, grace_period=grace,
        reduction_factor=integer(obj, "reductionFactor", path, 3, 2),
        perturbation_interval=integer(obj, "perturbationInterval", path, 5, 1),
        quantile_fraction=quantile, resample_probability=resample,
    )


def _budget(raw: Any) -> Budget:
    path = "spec.budget"
    obj = mapping(raw, path)
    only_keys(obj, path, ("maxTrials", "parallelism", "maxFailedTrials", "maxDuration", "admissionWindow",
                           "gpuHours", "cpuHours", "onExhausted"))
    return Budget(
        max_trials=integer(obj, "maxTrials", path, 10, 1, MAX_TRIALS),
        parallelism=integer(obj, "parallelism", path, 1, 1, MAX_PARALLELISM),
        max_failed_trials=integer(obj, "maxFailedTrials", path, None, 0),
        max_duration_s=duration(obj, "maxDuration", path),
        admission_window=integer(obj, "admissionWindow", path, 4, 1),
        gpu_hours=number(obj, "gpuHours", path, None, 0.0),
        cpu_hours=number(obj, "cpuHours", path, None, 0.0),
        on_exhausted=one_of(obj, "onExhausted", path, BUDGET_EXHAUSTED_ACTIONS, "stop", "action"),
    )


def _resources(raw: Any) -> TrialResources:
    path = "spec.trial.resources"
    obj = mapping(raw, path)
    only_keys(obj, path, ("cpu", "gpu", "memory", "custom", "bundles"))
    memory = None
    if obj.get("memory") is not None:
        try:
            memory = parse_memory(obj["memory"])
        except ValueError as exc:
            raise SpecError(f"{path}.memory", str(exc)) from None
    custom: dict[str, float] = {}
    for name, amount in mapping(obj.get("custom"), f"{path}.custom").items():
        if str(name).lower() in _RESERVED_RESOURCES:
            raise SpecError(f"{path}.custom.{name}", "use the cpu, gpu and memory fields for these")
        if not is_number(amount) or amount < 0:
            raise SpecError(f"{path}.custom.{name}", f"must be a number >= 0 (got {amount!r})")
        custom[str(name)] = float(amount)
    return TrialResources(
        cpu=number(obj, "cpu", path, 1.0, 0.0), gpu=number(obj, "gpu", path, 0.0, 0.0),
        memory=float(memory or 0), custom=custom, bundles=integer(obj, "bundles", path, 1, 1),
    )


def _trial(raw: Any, executor: str, space: Mapping[str, Param]) -> TrialTemplate:
    path = "spec.trial"
    obj = mapping(raw, path)
    only_keys(obj, path, ("entrypoint", "resources", "maxFailures", "queueTimeout", "timeout", "runtimeEnv", "config",
                           "template", "metricsCollector", "expectedIterationSeconds"))
    entrypoint = string(obj, "entrypoint", path)
    if entrypoint is None and executor == "ray":
        raise SpecError(f"{path}.entrypoint", "required for the ray executor: the function to tune, "
                                              "as \"package.module:function\"")
    if entrypoint is not None and not _ENTRYPOINT.match(entrypoint):
        raise SpecError(f"{path}.entrypoint", f"expected \"package.module:function\" (got {entrypoint!r})")
    config = dict(mapping(obj.get("config"), f"{path}.config"))
    for key in config:
        if key in space:
            raise SpecError(f"{path}.config.{key}", "is also in searchSpace, where the sampled value would "
                                                    "always win; remove it from one of them")
    resources = _resources(obj.get("resources"))
    return TrialTemplate(
        entrypoint=entrypoint, resources=resources,
        max_failures=integer(obj, "maxFailures", path, 0, 0),
        queue_timeout_s=duration(obj, "queueTimeout", path),
        timeout_s=duration(obj, "timeout", path),
        runtime_env=dict(mapping(obj.get("runtimeEnv"), f"{path}.runtimeEnv")), config=config,
        template=_pod_template(obj.get("template"), executor, resources, [*space, *config]),
        metrics_collector=_metrics_collector(obj, executor),
        expected_iteration_seconds=number(obj, "expectedIterationSeconds", path, None, 0.0),
    )


def _metrics_collector(obj: Mapping[str, Any], executor: str) -> str:
    """``spec.trial.metricsCollector``: how a trial pod's results reach the operator."""
    collector = one_of(obj, "metricsCollector", "spec.trial", METRICS_COLLECTORS, "push", "metrics collector")
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
    template = mapping(raw, path)
    containers = mapping(template.get("spec"), f"{path}.spec").get("containers")
    if not isinstance(containers, list) or not containers:
        raise SpecError(f"{path}.spec.containers", "required for the pod executor: at least one container; "
                                                   "the first one runs the trial")
    if resources.bundles > 1:
        raise SpecError("spec.trial.resources.bundles", "a pod trial is one pod: bundles > 1 needs the ray executor")
    if not float(resources.gpu).is_integer():
        raise SpecError("spec.trial.resources.gpu", f"{resources.gpu:g} is not a whole number; "
                                                    "Kubernetes schedules whole GPUs")
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(mapping(template.get("spec"), f"{path}.spec").get(kind) or []):
            where = f"{path}.spec.{kind}[{index}]"
            container = mapping(container, where)
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
    obj = mapping(raw, path)
    only_keys(obj, path, ("storage", "keepLast", "keepBest", "deleteOnCompletion"))
    return CheckpointSpec(
        storage=string(obj, "storage", path), keep_last=integer(obj, "keepLast", path, 2, 1),
        keep_best=integer(obj, "keepBest", path, 0, 0),
        delete_on_completion=boolean(obj, "deleteOnCompletion", path, False),
    )


def _ray(raw: Any) -> RaySpec:
    path = "spec.ray"
    obj = mapping(raw, path)
    if "tokenSecretRef" in obj:   # an earlier field, never used: say where the token comes from
        raise SpecError(f"{path}.tokenSecretRef", "not an Experiment field: the Ray auth token is the "
                        "operator's (Helm value ray.tokenSecretRef, the RAY_AUTH_TOKEN of its pod)")
    only_keys(obj, path, ("address",))
    address = string(obj, "address", path)
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
    root = mapping(spec, "spec", required=True)
    only_keys(root, "spec", TOP_LEVEL)
    _max_sizes(root)
    objectives, reference_point = objectives_spec.objectives(root, _objective)
    space = search_space(root.get("searchSpace"))
    search = _search(root.get("search"), space)
    scheduler = _scheduler(root.get("scheduler"))
    budget = _budget(root.get("budget"))
    if search.algorithm == "auto":
        chosen, why = auto_search.choose(objectives=len(objectives), max_trials=budget.max_trials,
                                         early_stopping=None if scheduler.type == "fifo" else scheduler.type)
        search = dataclasses.replace(search, algorithm=chosen, auto=why)
    objectives_spec.check_multi_objective(len(objectives), search.algorithm)
    executor = one_of(root, "executor", "spec", EXECUTORS, "ray", "executor")
    return ExperimentSpec(
        objective=objectives[0], objectives=objectives, reference_point=reference_point,
        constraints=objectives_spec.constraints(root.get("constraints")),
        warm_start=objectives_spec.warm_start(root.get("warmStart")),
        search_space=space, search=search, scheduler=scheduler, budget=budget,
        trial=_trial(root.get("trial"), executor, space), checkpoint=_checkpoint(root.get("checkpoint")),
        ray=_ray(root.get("ray")), executor=executor,
        priority=integer(root, "priority", "spec", 0, -2**31, 2**31 - 1), suspend=boolean(root, "suspend", "spec", False),
        queue=_kueue_name(root, "queue", executor), priority_class=_kueue_name(root, "priorityClass", executor),
    )


def _kueue_name(root: Mapping[str, Any], key: str, executor: str) -> str | None:
    """spec.queue / spec.priorityClass: Kueue names, which reach Kueue as label values."""
    value = string(root, key, "spec")
    if value is None:
        return None
    if executor != "pod":
        raise SpecError(f"spec.{key}", "Kueue admits pod trials only; set spec.executor: pod")
    if not KUEUE_NAME.match(value):
        raise SpecError(f"spec.{key}", f"must be a lowercase name of at most 63 characters "
                                       f"(a-z, 0-9, '-', '.'; got {value!r})")
    return value
