"""A Katib v1beta1 Experiment as a kubetune Experiment with pod trials.

| Katib | kubetune |
|---|---|
| objective type/goal/objectiveMetricName | objective mode/goal/metric (additionalMetricNames are collected) |
| parameters: double/int/categorical/discrete, feasibleSpace min/max/step/list, distribution logUniform | searchSpace uniform/loguniform/quniform/randint/choice/ordinal (discrete) |
| algorithm random/grid/tpe/multivariate-tpe/cmaes/bayesianoptimization/sobol (random_state) | search.algorithm random/grid/tpe/cmaes/gp/qmc (seed) |
| algorithm hyperband (r_l, eta, resource_name) | scheduler hyperband (maxIterations, reductionFactor) |
| earlyStopping medianstop (start_step) | scheduler median (gracePeriod) |
| trialTemplate trialSpec Job (or Pod), ``${trialParameters.x}`` | trial.template (the pod template), ``${params.<reference>}`` |
| metricsCollector StdOut / File (TEXT, JSON, filter formats) | metricsCollector stdout, the container wrapped by katib_metrics.py |
| maxTrialCount / parallelTrialCount / maxFailedTrialCount | budget maxTrials / parallelism / maxFailedTrials |
"""
from __future__ import annotations

import copy
import inspect
import json
import os
import posixpath
import re
from typing import Any

import yaml

from kubetune.convert import katib_metrics
from kubetune.convert.common import API_VERSION, Conversion, dns_name

ALGORITHMS = {"random": "random", "grid": "grid", "tpe": "tpe", "multivariate-tpe": "tpe", "cmaes": "cmaes",
              "bayesianoptimization": "gp", "sobol": "qmc"}
SEED_SETTINGS = ("random_state", "seed")
_REFERENCE = re.compile(r"\$\{trialParameters\.([^}]+)\}")
_ANY_KATIB = re.compile(r"\$\{trial(Spec|Parameters)\.[^}]*\}")
SUPPORTED_KINDS = ("Job", "Pod")
KATIB_VOLUME = "katib-metrics"


def from_katib(path: str) -> tuple[dict[str, Any], Conversion]:
    with open(path) as handle:
        documents = [d for d in yaml.safe_load_all(handle) if d]
    experiments = [d for d in documents if isinstance(d, dict) and d.get("kind") == "Experiment"
                   and str(d.get("apiVersion", "")).startswith("kubeflow.org/")]
    if len(experiments) != 1:
        raise ValueError(f"{path}: expected one Katib Experiment (apiVersion kubeflow.org/v1beta1), "
                         f"found {len(experiments)}")
    return convert(experiments[0], os.path.basename(path))


def convert(katib: dict[str, Any], source: str = "the Katib Experiment") -> tuple[dict[str, Any], Conversion]:
    conv = Conversion(source=source)
    ks = katib.get("spec") or {}
    if not str(katib.get("apiVersion", "")).endswith("v1beta1"):
        conv.note(f"apiVersion {katib.get('apiVersion')}: read as kubeflow.org/v1beta1")
    spec: dict[str, Any] = {"executor": "pod"}
    objective = _objective(ks.get("objective") or {}, conv)
    spec["objective"] = objective
    space = _parameters(ks.get("parameters") or [], conv)
    search, scheduler = _algorithm(ks.get("algorithm") or {}, space, conv)
    spec["searchSpace"] = space
    if search:
        spec["search"] = search
    early = ks.get("earlyStopping")
    if early:
        scheduler = _early_stopping(early, scheduler, conv)
    if scheduler:
        spec["scheduler"] = scheduler
    budget: dict[str, Any] = {}
    if ks.get("maxTrialCount") is not None:
        budget["maxTrials"] = int(ks["maxTrialCount"])
    else:
        conv.note("no maxTrialCount: Katib runs until the goal or the search space is done; "
                  "kubetune's default budget.maxTrials (10) applies")
    budget["parallelism"] = int(ks.get("parallelTrialCount") or 3)     # Katib's default
    if ks.get("maxFailedTrialCount") is not None:
        budget["maxFailedTrials"] = int(ks["maxFailedTrialCount"])
    spec["budget"] = budget
    metrics = [objective["metric"], *((ks.get("objective") or {}).get("additionalMetricNames") or [])]
    spec["trial"] = _trial(ks.get("trialTemplate") or {}, ks.get("metricsCollectorSpec") or {}, metrics,
                           space, scheduler, conv)
    if ks.get("resumePolicy") not in (None, "Never", "LongRunning"):
        conv.note(f"resumePolicy {ks['resumePolicy']}: kubetune keeps a finished Experiment's trials and results")
    name = (katib.get("metadata") or {}).get("name") or "katib-experiment"
    metadata: dict[str, Any] = {"name": dns_name(name)}
    if (katib.get("metadata") or {}).get("namespace"):
        metadata["namespace"] = katib["metadata"]["namespace"]
    return {"apiVersion": API_VERSION, "kind": "Experiment", "metadata": metadata, "spec": spec}, conv


def _settings(block: dict, where: str, conv: Conversion) -> dict[str, str]:
    out = {}
    for item in block.get("algorithmSettings") or []:
        if isinstance(item, dict) and "name" in item:
            out[str(item["name"])] = str(item.get("value", ""))
    return out


def _objective(objective: dict, conv: Conversion) -> dict[str, Any]:
    kind = objective.get("type")
    mode = {"maximize": "max", "minimize": "min"}.get(kind)
    metric = objective.get("objectiveMetricName")
    if mode is None or not metric:
        conv.refuse(f"objective type={kind!r} objectiveMetricName={metric!r}", "spec.objective",
                    "say type: maximize or minimize, and objectiveMetricName")
        return {"metric": metric or "objective", "mode": "min"}
    out: dict[str, Any] = {"metric": str(metric), "mode": mode}
    if objective.get("goal") is not None:
        out["goal"] = float(objective["goal"])
    for strategy in objective.get("metricStrategies") or []:
        if strategy.get("name") == metric and strategy.get("value") not in (None, mode):
            conv.note(f"metricStrategies {metric}: {strategy.get('value')}: kubetune ranks a trial by its best "
                      f"{metric} ({mode})")
    return out


def _number(text: Any, integer: bool) -> float | int:
    value = float(text)
    return int(value) if integer else value


def _parameters(parameters: list, conv: Conversion) -> dict[str, Any]:
    space: dict[str, Any] = {}
    for i, param in enumerate(parameters):
        where = f"spec.parameters[{i}]"
        name, kind = param.get("name"), param.get("parameterType")
        feasible = param.get("feasibleSpace") or {}
        distribution = feasible.get("distribution") or "uniform"
        if not name:
            conv.refuse("a parameter without a name", where, "name it")
            continue
        if kind in ("categorical", "discrete"):
            values = list(feasible.get("list") or [])
            if kind == "discrete":
                values = [_number(v, float(v).is_integer()) for v in values]
                ordered = sorted(set(values))
                # numbers in order: the samplers use it (a choice is unordered); an ordinal's
                # values stay within +-2^53 (spec/search_space.py), a choice's need not
                if len(ordered) > 1 and all(abs(v) <= 2 ** 53 for v in ordered):
                    space[name] = {"ordinal": ordered}
                    continue
            space[name] = {"choice": values}
            continue
        if kind not in ("double", "int"):
            conv.refuse(f"parameterType {kind!r}", where, "use double, int, categorical or discrete")
            continue
        if distribution in ("normal", "logNormal"):
            conv.refuse(f"distribution {distribution}", f"{where}.feasibleSpace",
                        "kubetune has no normal distributions; use uniform or logUniform")
            continue
        integer = kind == "int"
        low, high = _number(feasible.get("min"), integer), _number(feasible.get("max"), integer)
        step = feasible.get("step")
        if step not in (None, ""):
            if distribution == "logUniform":
                conv.refuse("logUniform with a step", f"{where}.feasibleSpace", "kubetune has no stepped log scale")
                continue
            space[name] = {"quniform": [low, high, _number(step, integer)]}
        elif integer:
            if distribution == "logUniform":
                conv.refuse("int with logUniform", f"{where}.feasibleSpace",
                            "kubetune has no integer log scale; use a double with logUniform")
                continue
            space[name] = {"randint": [low, high + 1]}       # Katib's max is included
        else:
            space[name] = {"loguniform" if distribution == "logUniform" else "uniform": [low, high]}
    return space


def _algorithm(algorithm: dict, space: dict, conv: Conversion) -> tuple[dict, dict]:
    name = algorithm.get("algorithmName") or "random"
    settings = _settings(algorithm, "spec.algorithm", conv)
    search: dict[str, Any] = {}
    scheduler: dict[str, Any] = {}
    if name == "hyperband":
        resource = settings.get("resource_name")
        if not resource or resource not in space or "r_l" not in settings:
            conv.refuse("hyperband", "spec.algorithm", "needs resource_name (a parameter) and r_l")
            return search, scheduler
        space.pop(resource)
        scheduler = {"type": "hyperband", "maxIterations": int(float(settings["r_l"])),
                     "reductionFactor": int(float(settings.get("eta", 3)))}
        conv.note(f"hyperband: the resource parameter {resource} is no longer sampled; each trial runs up to "
                  f"maxIterations={scheduler['maxIterations']} reports and hyperband stops it earlier "
                  f"(the template gets {resource} = r_l)")
        scheduler["_resource"] = (resource, scheduler["maxIterations"])
        return search, scheduler
    algorithm_name = ALGORITHMS.get(name)
    if algorithm_name is None:
        conv.refuse(f"algorithmName {name}", "spec.algorithm", "no kubetune search algorithm matches it "
                    f"(kubetune maps {', '.join(ALGORITHMS)} and hyperband)")
        return search, scheduler
    search["algorithm"] = algorithm_name
    for key in SEED_SETTINGS:
        if key in settings and settings[key].lstrip("-").isdigit():
            search["seed"] = int(settings[key])
    ignored = sorted(set(settings) - set(SEED_SETTINGS))
    if ignored:
        conv.note(f"algorithmSettings {', '.join(ignored)}: kubetune's {algorithm_name} uses Optuna's defaults")
    return search, scheduler


def _early_stopping(early: dict, scheduler: dict, conv: Conversion) -> dict:
    name = early.get("algorithmName")
    if name != "medianstop":
        conv.refuse(f"earlyStopping {name}", "spec.earlyStopping", "kubetune maps medianstop")
        return scheduler
    if scheduler:
        conv.refuse("earlyStopping with hyperband", "spec.earlyStopping", "kubetune runs one scheduler")
        return scheduler
    settings = _settings(early, "spec.earlyStopping", conv)
    out = {"type": "median", "gracePeriod": max(int(float(settings.get("start_step", 4))), 1)}
    if "min_trials_required" in settings:
        conv.note("medianstop min_trials_required: kubetune's median rule compares with the trials that "
                  "reached the same iteration")
    return out


# ---------------------------------------------------------------- the trial template

def _trial(template: dict, collector: dict, metrics: list[str], space: dict, scheduler: dict,
           conv: Conversion) -> dict[str, Any]:
    trial: dict[str, Any] = {"metricsCollector": "stdout"}
    references = {}
    for p in template.get("trialParameters") or []:
        if p.get("reference") not in space and not (scheduler.get("_resource") or ("",))[0] == p.get("reference"):
            if p.get("reference", "").startswith("${trialSpec."):
                conv.refuse(f"trialParameters {p.get('name')} = {p.get('reference')}", "spec.trialTemplate",
                            "kubetune has no trial metadata references; read KUBETUNE_TRIAL in the container")
                continue
            conv.refuse(f"trialParameters {p.get('name')} -> {p.get('reference')}", "spec.trialTemplate",
                        "it references no parameter")
            continue
        references[p["name"]] = p["reference"]
    body = template.get("trialSpec")
    if body is None:
        where = "spec.trialTemplate.configMap" if template.get("configMap") else "spec.trialTemplate"
        conv.refuse("a trialTemplate without trialSpec", where, "inline the trial's Job in trialSpec")
        return trial
    kind = body.get("kind")
    if kind not in SUPPORTED_KINDS:
        conv.refuse(f"trialSpec kind {kind}", "spec.trialTemplate.trialSpec",
                    "a kubetune pod trial is one Pod: use a batch Job or a Pod (no TFJob, PyTorchJob, MPIJob...)")
        return trial
    pod = copy.deepcopy(body["spec"]["template"] if kind == "Job" else {"metadata": body.get("metadata") or {},
                                                                       "spec": body.get("spec") or {}})
    if kind == "Job":
        backoff = (body.get("spec") or {}).get("backoffLimit")
        if backoff:
            trial["maxFailures"] = int(backoff)
    if kind == "Pod":
        pod["metadata"] = {k: v for k, v in pod["metadata"].items() if k in ("labels", "annotations")}
    pod_spec = pod.setdefault("spec", {})
    pod_spec["restartPolicy"] = "Never"
    containers = pod_spec.get("containers") or []
    primary = template.get("primaryContainerName") or (containers[0].get("name") if containers else None)
    container = next((c for c in containers if c.get("name") == primary), None)
    if container is None:
        conv.refuse(f"primaryContainerName {primary}", "spec.trialTemplate", "no container has that name")
        return trial
    resource = scheduler.pop("_resource", None)
    _substitute(pod, references, resource, conv, "spec.trialTemplate.trialSpec")
    _collect(container, pod_spec, collector, metrics, conv)
    trial["template"] = pod
    return trial


def _substitute(node: Any, references: dict, resource: tuple | None, conv: Conversion, where: str,
                in_command: bool = False) -> Any:
    """``${trialParameters.x}`` -> ``${params.<reference>}`` in command and args (the only
    places kubetune substitutes); anywhere else it is refused by its path."""
    if isinstance(node, dict):
        for key, value in node.items():
            node[key] = _substitute(value, references, resource, conv, f"{where}.{key}",
                                    in_command or key in ("command", "args"))
        return node
    if isinstance(node, list):
        return [_substitute(v, references, resource, conv, f"{where}[{i}]", in_command) for i, v in enumerate(node)]
    if not isinstance(node, str) or "${trial" not in node:
        return node

    def replace(match: re.Match) -> str:
        name = match.group(1)
        reference = references.get(name)
        if reference is None:
            conv.refuse(match.group(0), where, "no trialParameter of that name")
            return match.group(0)
        if resource and reference == resource[0]:
            return str(resource[1])
        return "${params.%s}" % reference

    if not in_command:
        conv.refuse(f"{node!r}", where, "kubetune substitutes parameters in command and args only; read the "
                    "environment variable KUBETUNE_PARAM_<NAME> (or /etc/kubetune/config.json) instead")
        return node
    text = _REFERENCE.sub(replace, node)
    if _ANY_KATIB.search(text):
        conv.refuse(f"{node!r}", where, "kubetune has no ${trialSpec...} references; "
                    "read KUBETUNE_TRIAL in the container")
    return text


def _collect(container: dict, pod_spec: dict, collector: dict, metrics: list[str], conv: Conversion) -> None:
    """Wrap the primary container so Katib's metrics become KUBETUNE_RESULT lines."""
    kind = ((collector.get("collector") or {}).get("kind")) or "StdOut"
    source = collector.get("source") or {}
    settings: dict[str, Any] = {"objective": metrics[0], "metrics": metrics[1:], "source": kind}
    formats = ((source.get("filter") or {}).get("metricsFormat")) or None
    if formats:
        settings["formats"] = list(formats)
    if kind == "File":
        path_spec = source.get("fileSystemPath") or {}
        path = path_spec.get("path")
        if not path or path_spec.get("kind", "File") != "File":
            conv.refuse("File collector without fileSystemPath.path (kind File)",
                        "spec.metricsCollectorSpec.source", "name the file the training writes")
            return
        settings.update(path=path, format=path_spec.get("format") or "TEXT")
        # Katib mounts a volume where the file goes: the directory must exist and be writable
        volumes = pod_spec.setdefault("volumes", [])
        if not any(v.get("name") == KATIB_VOLUME for v in volumes):
            volumes.append({"name": KATIB_VOLUME, "emptyDir": {}})
            container.setdefault("volumeMounts", []).append(
                {"name": KATIB_VOLUME, "mountPath": posixpath.dirname(path) or "/"})
    elif kind != "StdOut":
        fix = {"Push": "report with kubetune.report(...) (the default push collector) instead of Katib's SDK",
               "None": "a trial must report its metrics"}.get(kind, "print name=value lines (StdOut)")
        conv.refuse(f"metricsCollector {kind}", "spec.metricsCollectorSpec.collector", f"no equivalent; {fix}")
        return
    command = list(container.get("command") or []) + list(container.get("args") or [])
    if not command:
        conv.refuse("a primary container without command", "spec.trialTemplate",
                    "give its command (kubetune wraps it to collect the metrics; the image's entrypoint is unknown)")
        return
    container["command"] = ["python3", "-c", inspect.getsource(katib_metrics), json.dumps(settings), *command]
    container.pop("args", None)
    conv.note(f"the {container.get('name')} container's command runs under a small Python 3 wrapper "
              f"(kubetune/convert/katib_metrics.py) that turns Katib's {kind} metrics into result lines; "
              "its image needs python3")
