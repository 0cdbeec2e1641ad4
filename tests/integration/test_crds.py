"""The Experiment and Trial CRDs against a real kube-apiserver: what `kubectl apply`
accepts and rejects, printer columns, the status subresource, garbage collection."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from k8s_helpers import table
from kube_fixtures import wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION = "kubetune.dev", "v1alpha1"
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))

EXPERIMENT = {
    "apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "metadata": {"name": "exp"},
    "spec": {
        "objective": {"metric": "loss", "mode": "min"},
        "searchSpace": {"x": {"uniform": [0, 1]}},
        "trial": {"entrypoint": "pkg.module:train"},
    },
}


@pytest.fixture
def api(kube_cluster):
    with kube_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def custom(api):
    return client.CustomObjectsApi(api)


def experiment(**spec_changes) -> dict:
    body = copy.deepcopy(EXPERIMENT)
    body["spec"].update(spec_changes)
    return body


def create(custom, namespace, plural, body, dry_run=False):
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body,
                                                  dry_run="All" if dry_run else None)


def rejection(custom, namespace, body) -> str:
    with pytest.raises(ApiException) as info:
        create(custom, namespace, "experiments", body, dry_run=True)
    assert info.value.status == 422, info.value.body
    message = json.loads(info.value.body)["message"]
    # CEL errors under a map name the key as searchSpace[x]; read it as searchSpace.x
    return re.sub(r"\[([A-Za-z_][\w-]*)\]", r".\1", message)


# -- installation ----------------------------------------------------------------------

@pytest.mark.parametrize("name,kind,short", [("experiments.kubetune.dev", "Experiment", "exp"),
                                             ("trials.kubetune.dev", "Trial", "trl")])
def test_crd_is_established_with_names(api, name, kind, short):
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition(name)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert crd.spec.scope == "Namespaced"
    assert crd.spec.names.kind == kind
    assert crd.spec.names.short_names == [short]
    assert crd.spec.names.categories == ["kubetune"]
    [version] = crd.spec.versions
    assert (version.name, version.served, version.storage) == (VERSION, True, True)
    assert version.subresources.status is not None


# -- what apply accepts ------------------------------------------------------------------

@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted(custom, namespace, path):
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert documents, f"{path} is empty"
    for document in documents:
        created = create(custom, namespace, "experiments", document, dry_run=True)
        for key in ("objective", "objectives", "constraints"):
            assert created["spec"].get(key) == document["spec"].get(key)


def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "asha.yaml", "gpu-queueing.yaml"}


@pytest.mark.parametrize("changes", [
    {"searchSpace": {"c": {"choice": [1, 2.5, "adam", True]}}},             # mixed choice types
    {"searchSpace": {"w": {"ordinal": [16, 32.5, 64]}}, "search": {"algorithm": "cmaes"}},
    {"searchSpace": {"n": {"randint": [-3, 0]}}, "search": {"algorithm": "grid"}},
    {"scheduler": {"type": "pbt", "perturbationInterval": 2, "quantileFraction": 0.5,
                   "resampleProbability": 0}},
    {"scheduler": {"type": "hyperband", "maxIterations": 81}},
    {"executor": "pod", "trial": {"resources": {"cpu": 0.5, "memory": 1073741824},   # no entrypoint
                                  "template": {"spec": {"containers": [{"name": "t", "image": "busybox"}]}}}},
    {"budget": {"maxDuration": "1h30m", "maxFailedTrials": 0}, "suspend": True, "priority": -5},
    {"trial": {"entrypoint": "a.b:C.fit", "queueTimeout": "45s", "runtimeEnv": {"pip": ["torch"]},
               "resources": {"custom": {"TPU": 4}, "bundles": 4, "memory": "1.5Gi"}}},
    {"ray": {"address": "ray://raycluster-head-svc.ml:10001"}},
    {"constraints": [{"metric": "memory_gb", "max": 16}, {"metric": "acc", "min": 0.5, "max": 1}],
     "warmStart": {"experiments": ["earlier"], "maxTrials": 50},
     "search": {"algorithm": "nsgaii", "initialPoints": [{"x": 0.5}]}},
])
def test_valid_variants_are_accepted(custom, namespace, changes):
    created = create(custom, namespace, "experiments", experiment(**changes), dry_run=True)
    assert_contains(created["spec"], changes)


@pytest.mark.parametrize("objectives, changes", [
    ([{"metric": "loss", "mode": "min"}, {"metric": "size", "mode": "min"}], {"scheduler": {"type": "asha", "maxIterations": 9}}),
    ([{"metric": "loss", "mode": "min", "reference": 2}, {"metric": "acc", "mode": "max", "reference": 0}],
     {"search": {"algorithm": "tpe"}}),
])
def test_several_objectives_are_accepted(custom, namespace, objectives, changes):
    body = experiment(**changes)
    del body["spec"]["objective"]
    body["spec"]["objectives"] = objectives
    created = create(custom, namespace, "experiments", body, dry_run=True)
    assert created["spec"]["objectives"] == objectives


TWO = [{"metric": "loss", "mode": "min"}, {"metric": "size", "mode": "min"}]


@pytest.mark.parametrize("objectives, changes, field, words", [
    (TWO, {"search": {"algorithm": "cmaes"}}, "spec.search.algorithm", "cmaes"),
    (TWO, {"search": {"algorithm": "gp"}}, "spec.search.algorithm", "gp"),
    (TWO, {"scheduler": {"type": "median"}}, "spec.scheduler.type", "median"),
    (TWO, {"scheduler": {"type": "pbt"}}, "spec.scheduler.type", "pbt"),
    ([{"metric": "loss", "mode": "min", "reference": 1}, {"metric": "size", "mode": "min"}], {},
     "spec.objectives", "reference"),
    (TWO, {"objective": {"metric": "loss", "mode": "min"}}, "spec.objectives", "not both"),
    (TWO, {"constraints": [{"metric": "mem"}]}, "spec.constraints[0]", "max or min"),
])
def test_several_objectives_refuse_what_cannot_rank_vectors(custom, namespace, objectives, changes, field, words):
    body = experiment(**changes)
    if "objective" not in changes:
        del body["spec"]["objective"]
    body["spec"]["objectives"] = objectives
    message = rejection(custom, namespace, body)
    assert field in message and words in message, message


def assert_contains(actual, expected, path="spec"):
    """``expected`` is kept as written (the server may add defaults around it)."""
    if isinstance(expected, dict):
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} was dropped"
            assert_contains(actual[key], value, f"{path}.{key}")
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def test_defaults_are_filled_in(custom, namespace):
    spec = create(custom, namespace, "experiments",
                  experiment(budget={}, trial={"entrypoint": "m:f", "resources": {}}),
                  dry_run=True)["spec"]
    assert spec["executor"] == "ray" and spec["priority"] == 0 and spec["suspend"] is False
    assert spec["budget"] == {"maxTrials": 10, "parallelism": 1, "admissionWindow": 4, "onExhausted": "stop"}
    assert spec["trial"]["resources"] == {"cpu": 1, "gpu": 0, "bundles": 1}
    assert spec["trial"]["maxFailures"] == 0


# -- what apply rejects ------------------------------------------------------------------

DELETE = object()


def malformed(path: str, value) -> dict:
    body = copy.deepcopy(EXPERIMENT)
    *parents, last = path.split(".")
    node = body
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return body


# (what to change, new value, field the API server must name)
MALFORMED = [
    ("spec", DELETE, "spec"),
    ("spec.objective", DELETE, "spec.objective"),
    ("spec.objective.mode", "minimize", "spec.objective.mode"),
    ("spec.objective.metric", "", "spec.objective.metric"),
    ("spec.objective.goal", "low", "spec.objective.goal"),
    ("spec.searchSpace", DELETE, "spec.searchSpace"),
    ("spec.searchSpace", {}, "spec.searchSpace"),
    ("spec.searchSpace.x", {}, "spec.searchSpace.x"),
    ("spec.searchSpace.x", {"uniform": [0, 1], "choice": [1, 2]}, "spec.searchSpace.x"),
    ("spec.searchSpace.x", {"uniform": [5, 1]}, "spec.searchSpace.x.uniform"),
    ("spec.searchSpace.x", {"uniform": [0, 1, 2]}, "spec.searchSpace.x.uniform"),
    ("spec.searchSpace.x", {"uniform": ["a", "b"]}, "spec.searchSpace.x.uniform"),
    ("spec.searchSpace.x", {"loguniform": [0, 1]}, "spec.searchSpace.x.loguniform"),
    ("spec.searchSpace.x", {"loguniform": [1, 0.5]}, "spec.searchSpace.x.loguniform"),
    ("spec.searchSpace.x", {"quniform": [0, 1, 0]}, "spec.searchSpace.x.quniform"),
    ("spec.searchSpace.x", {"quniform": [2, 1, 0.5]}, "spec.searchSpace.x.quniform"),
    ("spec.searchSpace.x", {"randint": [3, 3]}, "spec.searchSpace.x.randint"),
    ("spec.searchSpace.x", {"randint": [1.5, 3]}, "spec.searchSpace.x.randint"),
    ("spec.searchSpace.x", {"choice": []}, "spec.searchSpace.x.choice"),
    ("spec.searchSpace.x", {"ordinal": [32, 16]}, "spec.searchSpace.x.ordinal"),
    ("spec.searchSpace.x", {"ordinal": [16]}, "spec.searchSpace.x.ordinal"),
    ("spec.searchSpace.x", {"ordinal": [16, 16, 32]}, "spec.searchSpace.x.ordinal"),
    ("spec.searchSpace.x", {"ordinal": ["small", "large"]}, "spec.searchSpace.x.ordinal"),
    ("spec.search.algorithm", "bayes", "spec.search.algorithm"),
    ("spec.search.seed", "seven", "spec.search.seed"),
    ("spec.scheduler.type", "fancy", "spec.scheduler.type"),
    ("spec.scheduler", {"type": "asha"}, "spec.scheduler.maxIterations"),
    ("spec.scheduler", {"type": "hyperband"}, "spec.scheduler.maxIterations"),
    ("spec.scheduler", {"type": "asha", "maxIterations": 5, "gracePeriod": 10}, "spec.scheduler.gracePeriod"),
    ("spec.scheduler.maxIterations", 0, "spec.scheduler.maxIterations"),
    ("spec.scheduler.reductionFactor", 1, "spec.scheduler.reductionFactor"),
    ("spec.scheduler.quantileFraction", 0.7, "spec.scheduler.quantileFraction"),
    ("spec.scheduler.quantileFraction", 0, "spec.scheduler.quantileFraction"),
    ("spec.scheduler.resampleProbability", 1.5, "spec.scheduler.resampleProbability"),
    ("spec.budget.maxTrials", 0, "spec.budget.maxTrials"),
    ("spec.budget.maxTrials", "ten", "spec.budget.maxTrials"),
    ("spec.budget.parallelism", -1, "spec.budget.parallelism"),
    ("spec.budget.maxFailedTrials", -1, "spec.budget.maxFailedTrials"),
    ("spec.budget.maxDuration", "2 hours", "spec.budget.maxDuration"),
    ("spec.trial", DELETE, "spec.trial.entrypoint"),
    ("spec.trial.entrypoint", "train.py", "spec.trial.entrypoint"),
    ("spec.trial.resources.cpu", -1, "spec.trial.resources.cpu"),
    ("spec.trial.resources.gpu", "one", "spec.trial.resources.gpu"),
    ("spec.trial.resources.memory", "lots", "spec.trial.resources.memory"),
    ("spec.trial.resources.memory", -5, "spec.trial.resources.memory"),
    ("spec.trial.resources.custom", {"TPU": -1}, "spec.trial.resources.custom.TPU"),
    ("spec.trial.resources.bundles", 0, "spec.trial.resources.bundles"),
    ("spec.trial.maxFailures", -2, "spec.trial.maxFailures"),
    ("spec.trial.queueTimeout", "soon", "spec.trial.queueTimeout"),
    ("spec.trial.runtimeEnv", ["pip"], "spec.trial.runtimeEnv"),
    ("spec.checkpoint.keepLast", 0, "spec.checkpoint.keepLast"),
    ("spec.checkpoint.keepBest", -1, "spec.checkpoint.keepBest"),
    ("spec.ray.address", "http://head:8265", "spec.ray.address"),
    ("spec.executor", "docker", "spec.executor"),
    ("spec.priority", 1.5, "spec.priority"),
    ("spec.suspend", "yes", "spec.suspend"),
    ("metadata.name", "x" * 64, "metadata.name"),
    # what would fail a second later (issue 21): refused at apply
    ("spec.budget.maxDuration", "0s", "spec.budget.maxDuration"),
    ("spec.trial.queueTimeout", "0h0m", "spec.trial.queueTimeout"),
    ("spec.search.seed", -1, "spec.search.seed"),
    ("spec.search.seed", 2**32, "spec.search.seed"),
    ("spec.ray.address", "ray://head-svc", "spec.ray.address"),
    ("spec.executor", "pod", "spec.trial.template"),
    ("spec.searchSpace.x", {"quniform": [0, 1, 2]}, "spec.searchSpace.x.quniform"),
    ("spec.priority", 2**31, "spec.priority"),
    ("spec.priority", -2**31 - 1, "spec.priority"),
    ("spec.searchSpace.x", {"choice": ["a" * 257]}, "spec.searchSpace.x.choice"),
    ("spec.searchSpace", {"": {"uniform": [0, 1]}}, "spec.searchSpace"),
]


@pytest.mark.parametrize("path,value,field", MALFORMED,
                         ids=[f"{path}={'<deleted>' if value is DELETE else json.dumps(value)[:30]}"
                              for path, value, _ in MALFORMED])
def test_malformed_experiment_is_rejected_naming_the_field(custom, namespace, path, value, field):
    message = rejection(custom, namespace, malformed(path, value))
    assert re.search(rf"(^|[\s\[]){re.escape(field)}(:|\[)", message), message


def test_malformed_trial_is_rejected(custom, namespace):
    trial = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial", "metadata": {"name": "t-0"},
             "spec": {"experiment": "t", "index": -1, "resources": {"cpu": -2}}}
    with pytest.raises(ApiException) as info:
        create(custom, namespace, "trials", trial, dry_run=True)
    message = json.loads(info.value.body)["message"]
    assert "spec.index" in message and "spec.resources.cpu" in message


# -- printer columns (kubectl get) ---------------------------------------------------------

def test_printer_columns(api, custom, namespace):
    create(custom, namespace, "experiments", EXPERIMENT)
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "experiments", "exp", {"status": {
        "phase": "Running", "progress": "3/8", "trialCounts": {"running": 2, "succeeded": 3},
        "bestTrial": {"name": "exp-1", "metric": 0.25, "iteration": 5}}})
    create(custom, namespace, "trials", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial", "metadata": {"name": "exp-1"},
        "spec": {"experiment": "exp", "index": 1, "parameters": {"x": 0.5}}})
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "trials", "exp-1", {
        "status": {"phase": "Running", "bestMetric": 0.25, "iteration": 5, "lastObjective": "NaN"}})

    columns, rows = table(api, namespace, "experiments")
    assert columns == ["Name", "Phase", "Done", "Running", "Best", "Front", "GPU-h", "Age"]
    assert rows[0][:5] == ["exp", "Running", "3/8", 2, 0.25]

    columns, rows = table(api, namespace, "trials")
    assert columns == ["Name", "Experiment", "Phase", "Metric", "Last", "Iteration", "Age"]
    assert rows[0][:6] == ["exp-1", "exp", "Running", 0.25, "NaN", 5]


# -- status subresource ------------------------------------------------------------------

EXPERIMENT_STATUS = {
    "phase": "Running",
    "conditions": [{"type": "Running", "status": "True", "reason": "TrialsRunning", "message": "2 running",
                    "lastTransitionTime": "2025-01-01T00:00:00Z", "observedGeneration": 1}],
    "observedGeneration": 1, "progress": "3/8",
    "trialCounts": {"created": 5, "pending": 0, "queued": 1, "running": 1, "paused": 0,
                    "succeeded": 2, "failed": 1, "stopped": 0},
    "bestTrial": {"name": "exp-2", "parameters": {"x": 0.5, "opt": "adam"}, "metric": 0.125, "iteration": 4},
    "queueReason": "waiting for 1 GPU; requested scale-up", "message": "3 of 8 trials done",
    "startTime": "2025-01-01T00:00:00Z", "completionTime": "2025-01-01T01:00:00Z",
}

TRIAL_STATUS = {
    "phase": "Stopped", "reason": "EarlyStopped", "message": "below rung 3 cutoff 0.41",
    "iteration": 3, "lastResultSeq": 7, "lastMetrics": {"loss": 0.5, "iteration": 3, "grad": "Infinity"},
    "lastObjective": 0.5, "bestMetric": 0.5, "bestIteration": 3,
    "history": [{"loss": "NaN", "iteration": 1}, {"loss": 0.5, "iteration": 3}], "historyStride": 2,
    "decisionState": {"study": {"steps": [[1, "NaN"], [3, 0.5]], "attrs": {"completed_rung_0": 0.5}},
                      "scheduler": {"lastPerturbation": 2}},
    "failureCount": 1,
    "checkpoint": "/tmp/ckpt/3", "attempt": 1,
    "failures": [{"attempt": 0, "reason": "ActorDied", "message": "node lost", "time": "2025-01-01T00:00:00Z"}],
    "parent": "exp-0", "lineage": [{"iteration": 2, "from": "exp-0", "params": {"x": 0.25}}],
    "startTime": "2025-01-01T00:00:00Z", "completionTime": "2025-01-01T00:10:00Z",
    "conditions": [{"type": "Succeeded", "status": "False", "reason": "EarlyStopped", "message": "",
                    "lastTransitionTime": "2025-01-01T00:10:00Z", "observedGeneration": 1}],
}


@pytest.mark.parametrize("plural,body,status", [
    ("experiments", EXPERIMENT, EXPERIMENT_STATUS),
    ("trials", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial", "metadata": {"name": "exp-0"},
                "spec": {"experiment": "exp", "index": 0, "parameters": {"x": 0.1},
                         "resources": {"cpu": 1, "gpu": 0, "memory": "2Gi", "bundles": 1}}}, TRIAL_STATUS),
])
def test_status_subresource_keeps_spec_and_status_apart(custom, namespace, plural, body, status):
    name = body["metadata"]["name"]
    created = create(custom, namespace, plural, body)

    # every contract field survives a status write (nothing pruned), spec untouched
    patched = custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name,
                                                           {"status": status})
    assert patched["status"] == status
    assert patched["spec"] == created["spec"]
    assert patched["metadata"]["generation"] == created["metadata"]["generation"]

    # a write to the main resource ignores status
    changed = custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, {
        "metadata": {"labels": {"touched": "yes"}}, "status": {"phase": "Failed"}})
    assert changed["status"] == status

    # a status write ignores spec
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name, {
        "spec": {"suspend": True, "index": 9}, "status": {"message": "hello"}})
    current = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    assert current["spec"] == created["spec"]
    assert current["status"]["message"] == "hello"


def test_bad_status_is_rejected(custom, namespace):
    create(custom, namespace, "experiments", EXPERIMENT)
    with pytest.raises(ApiException) as info:
        custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, "experiments", "exp",
                                                     {"status": {"phase": "Exploded"}})
    assert info.value.status == 422 and "status.phase" in info.value.body


def test_spec_change_bumps_generation(custom, namespace):
    created = create(custom, namespace, "experiments", EXPERIMENT)
    patched = custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "exp",
                                                    {"spec": {"suspend": True}})
    assert patched["metadata"]["generation"] == created["metadata"]["generation"] + 1


def test_trial_identity_is_immutable(custom, namespace):
    create(custom, namespace, "trials", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial",
                                         "metadata": {"name": "exp-0"},
                                         "spec": {"experiment": "exp", "index": 0}})
    with pytest.raises(ApiException) as info:
        custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trials", "exp-0",
                                              {"spec": {"index": 1}})
    assert info.value.status == 422 and "immutable" in info.value.body
    # parameters may change (PBT explore)
    custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, "trials", "exp-0",
                                          {"spec": {"parameters": {"x": 2}}})


# -- garbage collection (kube-controller-manager) -----------------------------------------

def test_deleting_an_experiment_collects_what_it_owns(api, custom, namespace):
    owner = create(custom, namespace, "experiments", EXPERIMENT)
    reference = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Experiment", "name": "exp",
                 "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "exp-data", "ownerReferences": [reference]}})
    create(custom, namespace, "trials", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Trial",
                                         "metadata": {"name": "exp-0", "ownerReferences": [reference],
                                                      "labels": {"kubetune.dev/experiment": "exp"}},
                                         "spec": {"experiment": "exp", "index": 0}})

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "experiments", "exp")

    def gone() -> bool:
        configmaps = core.list_namespaced_config_map(namespace, field_selector="metadata.name=exp-data").items
        trials = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trials")["items"]
        return not configmaps and not trials

    wait_for(gone, timeout=60, interval=0.2, message="the garbage collector to delete the owned objects")


@pytest.mark.parametrize("names,message", [
    (["a.b", "a_b"], "one environment variable of a pod trial, KUBETUNE_PARAM_A_B: "),
    (["lr", "LR"], "one environment variable of a pod trial, KUBETUNE_PARAM_LR: "),
    (["x", "true"], "kubectl reads YAML 1.1"),
    (["x", "a b"], "letters, digits and _ . - / :"),
])
def test_parameter_names_are_refused_with_the_reason(custom, namespace, names, message):
    body = experiment(searchSpace={name: {"uniform": [0, 1]} for name in names})
    refused = rejection(custom, namespace, body)
    assert "spec.searchSpace" in refused and message in refused, refused
