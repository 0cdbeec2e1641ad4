"""The Experiment CRD (what `kubectl apply` checks and fills in) and kubetune.spec (what
`kubetune run` and the operator check and fill in) cannot drift: the same enums, the
same defaults, the same numeric bounds.  A field added to one and not the other fails here."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from kubetune.core.schedulers import SCHEDULERS, scheduler_class
from kubetune.spec import SpecError, parse_experiment
from kubetune.spec.model import (ALGORITHMS, BUDGET_EXHAUSTED_ACTIONS, DISTRIBUTIONS, EXECUTORS, METRICS_COLLECTORS,
                                  WARM_START_SPACES)
from kubetune.spec.parse import TOP_LEVEL

CRD = Path(__file__).resolve().parents[2] / "crds" / "experiment.yaml"
MINIMAL = {"objective": {"metric": "loss", "mode": "min"}, "searchSpace": {"x": {"uniform": [0, 1]}},
           "trial": {"entrypoint": "m:f"}}
# optional sections whose own defaults are checked need their required fields
WITH_SECTIONS = {**MINIMAL, "warmStart": {"experiments": ["earlier"]}}


def spec_schema() -> dict[str, Any]:
    [version] = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def fields(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path under spec, schema) of every named property, depth first."""
    for name, child in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        yield where, child
        yield from fields(child, where)


def field(path: str) -> dict[str, Any]:
    return dict(fields(spec_schema()))[path]


def with_value(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(WITH_SECTIONS)
    *parents, last = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return spec


# -- enums ---------------------------------------------------------------------------------

@pytest.mark.parametrize("path,names", [
    ("search.algorithm", ALGORITHMS), ("scheduler.type", SCHEDULERS), ("executor", EXECUTORS),
    ("trial.metricsCollector", METRICS_COLLECTORS), ("objective.mode", ("min", "max")),
    ("warmStart.searchSpace", WARM_START_SPACES), ("budget.onExhausted", BUDGET_EXHAUSTED_ACTIONS),
])
def test_enums_are_the_same(path, names):
    assert tuple(field(path)["enum"]) == tuple(names)
    # a spec every name fits: a finite space (grid), an iteration cap (asha), a template (pod)
    base = {**MINIMAL, "searchSpace": {"x": {"choice": [1, 2]}}, "scheduler": {"maxIterations": 10},
            "executor": "pod", "trial": {"template": {"spec": {"containers": [{"name": "t"}]}}},
            "warmStart": {"experiments": ["earlier"]}}
    for name in names:
        spec = copy.deepcopy(base)
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = name
        if spec["executor"] == "ray":
            spec["trial"] = {"entrypoint": "m:f"}
        scheduler_class(parse_experiment(spec))



def _cel_names(rule_start: str) -> set[str]:
    """The scheduler names in the list literal of the CRD's CEL rule starting so."""
    rules = [r["rule"] for _, schema in [("", spec_schema()), *fields(spec_schema())]
             for r in schema.get("x-kubernetes-validations") or [] if r["rule"].startswith(rule_start)]
    [rule] = rules
    [names] = re.findall(r"self\.(?:scheduler\.)?type in \[([^\]]*)\]", rule)
    return {name.strip(" '\"") for name in names.split(",")}


def test_the_crds_scheduler_rules_list_what_the_schedulers_declare():
    """`kubectl apply` refuses several objectives with a single-objective scheduler, and a
    missing maxIterations, from lists in CEL rules: a new scheduler's `objectives` or
    `requires_max_iterations` must be in them, or the API server and the operator disagree."""
    from kubetune.core.schedulers import MULTI_OBJECTIVE_SCHEDULERS
    assert _cel_names("!has(self.objectives) || size(self.objectives) < 2 || !has(self.scheduler)") == \
        set(MULTI_OBJECTIVE_SCHEDULERS)
    needs_cap = {name for name, cls in {**SCHEDULERS, **MULTI_OBJECTIVE_SCHEDULERS}.items()
                 if cls.requires_max_iterations}
    assert _cel_names("!has(self.type) || !(self.type in") == needs_cap

def test_adding_a_scheduler_is_its_file_its_test_the_crd_enum_and_the_docs_row():
    """CONTRIBUTING.md, "Adding a scheduler": the registry finds each scheduler in its own
    file of core/schedulers/, and no other module names one (spec's default, fifo, aside),
    so a new scheduler needs no other file; the CRD enum and the docs' scheduler table
    (docs/reference/schedulers.md) list each."""
    import inspect

    import kubetune
    from kubetune.core.schedulers import MULTI_OBJECTIVE_SCHEDULERS
    classes = {*SCHEDULERS.values(), *MULTI_OBJECTIVE_SCHEDULERS.values()}
    assert {"percentile", "pbt", "median", "hyperband", "asha", "fifo"} <= set(SCHEDULERS)
    for cls in classes:
        assert cls.__module__ == f"kubetune.core.schedulers.{Path(inspect.getfile(cls)).stem}"
    package = Path(kubetune.__file__).parent
    mentions = {}
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package)
        if where.parts[0] in ("bench", "convert") or where.parts[:2] == ("core", "schedulers"):
            continue      # the benchmarks' workloads name the schedulers they run; the converters
            #               map Ray Tune's and Katib's schedulers (FIFOScheduler, ...) to kubetune's
        text = path.read_text()
        named = {name for name in SCHEDULERS if re.search(rf"[\"']{name}[\"']", text)}
        named |= {cls.__name__ for cls in classes if re.search(rf"\b{cls.__name__}\b", text)}
        if named:
            mentions[str(where)] = named
    # the default, and search.algorithm auto's one scheduler-specific rule (random search under
    # ASHA, from the search-quality benchmark): a new scheduler still needs no other file
    assert mentions == {"spec/model.py": {"fifo"}, "spec/parse.py": {"fifo"}, "spec/auto_search.py": {"asha"}}
    assert set(field("scheduler.type")["enum"]) == set(SCHEDULERS)
    table = (CRD.parents[1] / "docs" / "reference" / "schedulers.md").read_text()
    assert [name for name in SCHEDULERS if not re.search(rf"^\| `{name}`( \(default\))? \|", table, re.M)] == []


def test_distributions_and_top_level_fields_are_the_same():
    assert tuple(spec_schema()["properties"]["searchSpace"]["additionalProperties"]["properties"]) == DISTRIBUTIONS
    assert set(spec_schema()["properties"]) == set(TOP_LEVEL)


# -- defaults ------------------------------------------------------------------------------

# CRD path -> where parse_experiment puts it
MODEL: dict[str, Callable[[Any], Any]] = {
    "search.algorithm": lambda s: s.search.algorithm,
    "scheduler.type": lambda s: s.scheduler.type,
    "scheduler.gracePeriod": lambda s: s.scheduler.grace_period,
    "scheduler.reductionFactor": lambda s: s.scheduler.reduction_factor,
    "scheduler.perturbationInterval": lambda s: s.scheduler.perturbation_interval,
    "scheduler.quantileFraction": lambda s: s.scheduler.quantile_fraction,
    "scheduler.resampleProbability": lambda s: s.scheduler.resample_probability,
    "budget.maxTrials": lambda s: s.budget.max_trials,
    "budget.parallelism": lambda s: s.budget.parallelism,
    "budget.admissionWindow": lambda s: s.budget.admission_window,
    "trial.resources.cpu": lambda s: s.trial.resources.cpu,
    "trial.resources.gpu": lambda s: s.trial.resources.gpu,
    "trial.resources.bundles": lambda s: s.trial.resources.bundles,
    "trial.maxFailures": lambda s: s.trial.max_failures,
    "trial.metricsCollector": lambda s: s.trial.metrics_collector,
    "checkpoint.keepLast": lambda s: s.checkpoint.keep_last,
    "checkpoint.keepBest": lambda s: s.checkpoint.keep_best,
    "checkpoint.deleteOnCompletion": lambda s: s.checkpoint.delete_on_completion,
    "executor": lambda s: s.executor,
    "priority": lambda s: s.priority,
    "suspend": lambda s: s.suspend,
    "warmStart.maxTrials": lambda s: s.warm_start.max_trials,
    "warmStart.searchSpace": lambda s: s.warm_start.search_space,
    "budget.onExhausted": lambda s: s.budget.on_exhausted,
}
DESCRIBED_DEFAULT = re.compile(r"\bdefault (-?[0-9.]+|[a-z]+)\b")


def crd_defaults() -> dict[str, Any]:
    """Defaults the API server fills in, and those the CRD only states ("default 3")."""
    found = {}
    for path, schema in fields(spec_schema()):
        if "default" in schema:
            found[path] = schema["default"]
        elif (match := DESCRIBED_DEFAULT.search(str(schema.get("description", "")))):
            found[path] = yaml.safe_load(match.group(1))
    return found


def test_every_crd_default_is_the_parsers():
    defaults = crd_defaults()
    assert set(defaults) <= set(MODEL), f"add these to MODEL: {sorted(set(defaults) - set(MODEL))}"
    parsed = parse_experiment(WITH_SECTIONS)
    for path, value in defaults.items():
        assert MODEL[path](parsed) == value, path


def test_every_parser_default_is_in_the_crd():
    assert set(MODEL) - {"trial.metricsCollector"} <= set(crd_defaults())
    # the pod executor's collector: stated in the description, "(default push)"
    assert "(default push)" in field("trial.metricsCollector")["description"]
    assert MODEL["trial.metricsCollector"](parse_experiment(WITH_SECTIONS)) == "push"


# -- bounds --------------------------------------------------------------------------------

def bounded_fields() -> list[tuple[str, str, Any, Any]]:
    """(path, side, a value out of bounds, the bound itself) for every minimum and maximum."""
    found = []
    for path, schema in fields(spec_schema()):
        step = 1 if schema.get("type") == "integer" else 0.5
        if "minimum" in schema:
            bound = schema["minimum"]
            inside = bound + step if schema.get("exclusiveMinimum") else bound
            found.append((path, "minimum", bound if schema.get("exclusiveMinimum") else bound - step, inside))
        if "maximum" in schema:
            found.append((path, "maximum", schema["maximum"] + step, schema["maximum"]))
    return found


BOUNDS = bounded_fields()


def test_the_bounds_are_found():
    paths = {path for path, *_ in BOUNDS}
    assert {"search.seed", "priority", "budget.maxTrials", "scheduler.quantileFraction"} <= paths


@pytest.mark.parametrize("path,side,outside,inside", BOUNDS, ids=[f"{b[0]}.{b[1]}" for b in BOUNDS])
def test_the_parser_has_the_crds_bounds(path, side, outside, inside):
    with pytest.raises(SpecError) as refused:
        parse_experiment(with_value(path, outside))
    assert refused.value.path == f"spec.{path}"
    parse_experiment(with_value(path, inside))


@pytest.mark.parametrize("path,value", [("budget.maxDuration", "0s"), ("trial.queueTimeout", "0h0m"),
                                        ("ray.address", "ray://head"), ("search.seed", -1)])
def test_what_the_crd_refuses_the_parser_refuses(path, value):
    with pytest.raises(SpecError) as refused:
        parse_experiment(with_value(path, value))
    assert refused.value.path == f"spec.{path}"


def test_unknown_names_are_errors_in_core_too():
    from kubetune.core.schedulers import make_scheduler
    from kubetune.core.search import Searcher
    from kubetune.spec.model import SchedulerSpec, SearchSpec
    from dataclasses import replace

    parsed = parse_experiment(MINIMAL)
    with pytest.raises(SpecError, match="unknown algorithm 'bayes'"):
        Searcher(replace(parsed, search=SearchSpec(algorithm="bayes")))
    with pytest.raises(SpecError, match="unknown scheduler 'bohb'"):
        make_scheduler(replace(parsed, scheduler=SchedulerSpec(type="bohb")), Searcher(parsed))


def test_the_search_space_size_policy_counts_to_the_parsers_limit():
    # the chart's admission policy refuses at apply what the parser refuses later
    from kubetune.spec.search_space import MAX_SEARCH_SPACE_SIZE
    policy = (CRD.parents[1] / "charts" / "kubetune" / "templates" / "search-space-size-policy.yaml").read_text()
    assert re.search(r"\$limit := (\d+)", policy).group(1) == str(MAX_SEARCH_SPACE_SIZE)
    # the same sum: name + 32, each choice string's length, 8 per number or boolean
    assert "size(name) + 32" in policy and "type(v) == string ? size(v) : 8" in policy
    assert "8 * size(variables.space[name].ordinal)" in policy       # and 8 per ordinal value


def test_the_search_space_size_counts_names_and_choice_strings():
    from kubetune.spec.search_space import search_space_size
    space = {"lr": {"uniform": [0, 1]}, "act": {"choice": ["relu", "gelu", 3, True, 0.5]}}
    assert search_space_size(space) == (2 + 32) + (3 + 32 + 4 + 4 + 8 + 8 + 8)
    big = {f"p{i}": {"choice": ["v" * 256] * 256} for i in range(2)}
    with pytest.raises(SpecError, match=r"spec.searchSpace: is too large: 128 KiB \(at most 128 KiB"):
        parse_experiment({**MINIMAL, "searchSpace": big})


class _UniqueKeys(yaml.SafeLoader):
    """YAML as the API server's decoder reads it: a key twice in one mapping is an error
    (PyYAML silently keeps the last one, so such a file passed every other test)."""


def _mapping_with_unique_keys(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_with_unique_keys)
ROOT = CRD.parents[1]


@pytest.mark.parametrize("path", sorted([*(ROOT / "crds").glob("*.yaml"), *(ROOT / "examples").rglob("*.yaml")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_manifests_name_each_key_once(path):
    list(yaml.load_all(path.read_text(), Loader=_UniqueKeys))


# -- every enum and size bound of the CRD is checked above or here -------------------------

ENUMS = {"search.algorithm", "scheduler.type", "executor", "trial.metricsCollector", "objective.mode",
         "warmStart.searchSpace", "budget.onExhausted"}


def test_every_crd_enum_is_compared():
    in_crd = {path for path, schema in fields(spec_schema()) if "enum" in schema}
    assert in_crd == ENUMS, f"compare these enums in test_enums_are_the_same: {sorted(in_crd ^ ENUMS)}"


def _objective(i: int) -> dict[str, Any]:
    return {"metric": f"m{i}", "mode": "min"}


# CRD path -> a valid value of n elements (items, properties or characters)
SIZED: dict[str, Callable[[int], Any]] = {
    "objective.metric": lambda n: "m" * n,
    "objectives": lambda n: [_objective(i) for i in range(n)],
    "constraints": lambda n: [{"metric": f"c{i}", "max": 1} for i in range(n)],
    "warmStart.experiments": lambda n: [f"e{i}" for i in range(n)],
    "searchSpace": lambda n: {f"p{i}": {"uniform": [0, 1]} for i in range(n)},
    "search.initialPoints": lambda n: [{"x": 0.5}] * n,
    "budget.maxDuration": lambda n: "1" * (n - 1) + "s",
    "trial.queueTimeout": lambda n: "1" * (n - 1) + "s",
    "trial.timeout": lambda n: "1" * (n - 1) + "s",
    "trial.entrypoint": lambda n: "m" * (n - 2) + ":f",
    "trial.resources.custom": lambda n: {f"r{i}": 1 for i in range(n)},
    "checkpoint.storage": lambda n: "/" * n,
    "ray.address": lambda n: "ray://" + "h" * (n - 12) + ":10001",
    "queue": lambda n: "q" * n,
    "priorityClass": lambda n: "p" * n,
}
SIZE_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def size_bounds() -> list[tuple[str, str, int]]:
    return [(path, key, schema[key]) for path, schema in fields(spec_schema()) for key in SIZE_KEYS
            if key in schema]


SIZES = size_bounds()


def test_every_crd_size_bound_is_compared():
    from kubetune.spec.parse import MAX_SIZES
    assert {path for path, *_ in SIZES} == set(SIZED), "give SIZED a value maker for each sized field"
    assert {path: bound for path, key, bound in SIZES if key.startswith("max")} == MAX_SIZES


def _sized_spec(path: str, n: int) -> dict[str, Any]:
    spec = with_value(path, SIZED[path](n))
    if path == "objectives":       # objectives replace objective
        spec.pop("objective")
    if path == "search.initialPoints":
        spec["searchSpace"] = {"x": {"uniform": [0, 1]}}
    if path == "constraints":
        spec["searchSpace"] = {"x": {"uniform": [0, 1]}}
    if path in ("queue", "priorityClass"):   # Kueue names: pod trials only
        spec.update(executor="pod", trial={"template": {"spec": {"containers": [{"name": "t"}]}}})
    return spec


@pytest.mark.parametrize("path,key,bound", SIZES, ids=[f"{p}.{k}" for p, k, _ in SIZES])
def test_the_parser_has_the_crds_size_bounds(path, key, bound):
    parse_experiment(_sized_spec(path, bound))             # the bound itself is accepted
    outside = bound + 1 if key.startswith("max") else bound - 1
    if outside < 0 or (outside == 0 and path in ("objective.metric", "checkpoint.storage")):
        return                                             # "" is refused as a missing value
    with pytest.raises(SpecError) as refused:
        parse_experiment(_sized_spec(path, outside))
    assert refused.value.path.startswith(f"spec.{path}"), refused.value
