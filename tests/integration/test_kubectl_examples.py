"""The examples through the user's path: the project's own kubectl (YAML 1.1, where an
unquoted ``y:`` is ``true``) against the real API server, compared with what
``kubetune run`` reads from the same file (PyYAML)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kubetune.core.search import Searcher
from kubetune.devcluster.build import kubernetes_version
from kubetune.local_run import load_experiment
from kubetune.spec import parse_experiment
from kubetune.spec.model import SpecError

pytestmark = pytest.mark.integration

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
EXPERIMENT_FILES = sorted(path for path in EXAMPLES_DIR.rglob("*.yaml")
                          if any((doc or {}).get("kind") == "Experiment"
                                 for doc in yaml.safe_load_all(path.read_text())))


REPO = EXAMPLES_DIR.parent
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def is_experiment(block: str) -> bool:
    """A ```yaml block that is one whole Experiment (not a snippet that names the kind,
    such as Flux's healthCheckExprs)."""
    try:
        documents = [d for d in yaml.safe_load_all(block) if d is not None]
    except yaml.YAMLError:
        return "kind: Experiment" in block      # broken YAML: let the apply say why
    return (len(documents) == 1 and isinstance(documents[0], dict) and documents[0].get("kind") == "Experiment"
            and str(documents[0].get("apiVersion", "")).startswith("kubetune.dev/"))


# the Experiments written out whole in README.md and docs/ (```yaml blocks that are an
# Experiment), by page: the file a user would copy each into
DOC_EXPERIMENTS = [(f"{page.relative_to(REPO)}-{n}", block) for page in DOC_PAGES
                   for n, block in enumerate((b for b in re.findall(r"```yaml[^\n]*\n(.*?)```", page.read_text(), re.S)
                                              if is_experiment(b)), start=1)]


def test_kubectl_is_the_control_planes_version(kubectl):
    client = json.loads(kubectl("version", "--client", "-o", "json").stdout)["clientVersion"]
    assert client["gitVersion"] == kubernetes_version()
    assert "experiments.kubetune.dev" in kubectl("get", "crd", "-o", "name").stdout


def test_every_readme_example_is_checked():
    names = {str(path.relative_to(EXAMPLES_DIR)) for path in EXPERIMENT_FILES}
    assert names >= {"quickstart.yaml", "asha.yaml", "gpu-queueing.yaml", "kuberay/experiment.yaml"}


def applied_with_kubectl(kubectl, namespace: str, path: Path) -> dict:
    """The Experiment as the API server stores it after ``kubectl apply -f path``."""
    kubectl("apply", "-n", namespace, "-f", str(path))
    name = load_experiment(str(path))["metadata"]["name"]
    return json.loads(kubectl("get", "-n", namespace, "experiment", name, "-o", "json").stdout)


def test_the_docs_experiments_are_checked():
    names = {name for name, _ in DOC_EXPERIMENTS}
    assert {"README.md-1", "docs/tutorials/first-experiment.md-2"} <= names, names
    assert any("name: mnist-lr" in block for _, block in DOC_EXPERIMENTS)


@pytest.mark.parametrize("source", [*EXPERIMENT_FILES, *(block for _, block in DOC_EXPERIMENTS)],
                         ids=[*(str(p.relative_to(EXAMPLES_DIR)) for p in EXPERIMENT_FILES),
                              *(name for name, _ in DOC_EXPERIMENTS)])
def test_example_gives_the_same_trials_through_kubectl_and_kubetune_run(kubectl, namespace, source, tmp_path):
    path = source
    if isinstance(source, str):      # a docs block: the file a user would copy it into
        path = tmp_path / "experiment.yaml"
        path.write_text(source)
    stored = applied_with_kubectl(kubectl, namespace, path)["spec"]
    local = load_experiment(str(path))["spec"]           # what `kubetune run` reads
    assert sorted(stored["searchSpace"]) == sorted(local["searchSpace"])
    # the server fills in the CRD's defaults, `kubetune run` the parser's: the same spec either way
    assert parse_experiment(stored) == parse_experiment(local)
    # an example without a seed samples at random: give both the same seed to compare the trials
    seeded = [replace(spec, search=replace(spec.search, seed=spec.search.seed or 0))
              for spec in (parse_experiment(stored), parse_experiment(local))]
    through_kubectl, through_run = Searcher(seeded[0]), Searcher(seeded[1])
    for index in range(3):
        assert through_kubectl.suggest(f"t-{index}") == through_run.suggest(f"t-{index}")


def manifest_with(name: str, keys: list[str]) -> str:
    """An Experiment manifest as a user writes it, with these searchSpace keys as written
    (quoted or not)."""
    space = "".join(f"    {key}: {{uniform: [0, 1]}}\n" for key in keys)
    return f"""
apiVersion: kubetune.dev/v1alpha1
kind: Experiment
metadata: {{name: {name}}}
spec:
  objective: {{metric: loss, mode: min}}
  searchSpace:
{space}  trial: {{entrypoint: "m:f"}}
"""


@pytest.mark.parametrize("key", ["y", "n", "yes", "No", "on", "OFF"])
def test_an_unquoted_yaml_11_boolean_key_is_refused_with_the_fix(kubectl, namespace, key):
    manifest = manifest_with("yaml11", ["x", key])
    refused = kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
    assert refused.returncode != 0
    assert "spec.searchSpace" in refused.stderr and "YAML 1.1" in refused.stderr, refused.stderr
    assert "quote the key" in refused.stderr, refused.stderr
    # quoted, the same key is an ordinary parameter name
    quoted = manifest.replace(f"    {key}:", f'    "{key}":')
    kubectl("apply", "-n", namespace, "-f", "-", input=quoted)
    stored = json.loads(kubectl("get", "-n", namespace, "experiment", "yaml11", "-o", "json").stdout)
    assert sorted(stored["spec"]["searchSpace"]) == sorted(["x", key])


@pytest.mark.parametrize("names,variable", [
    (["a.b", "a_b"], "KUBETUNE_PARAM_A_B"),
    (["lr", "LR"], "KUBETUNE_PARAM_LR"),
    (["w-1", "W:1", "x"], "KUBETUNE_PARAM_W_1"),
])
def test_parameter_names_that_are_one_variable_are_refused_naming_both(kubectl, namespace, names, variable):
    manifest = manifest_with("clash", [f'"{name}"' for name in names])
    refused = kubectl("apply", "-n", namespace, "-f", "-", input=manifest, check=False)
    assert refused.returncode != 0
    message = refused.stderr
    assert "spec.searchSpace" in message and f"one environment variable of a pod trial, {variable}: " in message
    clashing = [name for name in names if name != "x"]
    # both keys named, in either order (the API server iterates the map at random)
    assert (f"{clashing[0]} and {clashing[1]}" in message or f"{clashing[1]} and {clashing[0]}" in message), message
    assert "rename one of them" in message
    # and `kubetune run` refuses the same file naming the same two
    with pytest.raises(SpecError) as local:
        parse_experiment(yaml.safe_load(manifest)["spec"])
    assert variable in str(local.value) and all(name in str(local.value) for name in clashing)


def test_kubectl_explain_answers_from_the_crd_descriptions(kubectl):
    """`kubectl explain` is the Kubernetes user's habit: it answers for a field from the
    schema the API server publishes, which carries every description of crds/*.yaml
    (tests/unit/test_crd_descriptions.py checks that each property has one)."""
    scheduler = kubectl("explain", "experiment.spec.scheduler").stdout
    assert "which trials stop early" in scheduler, scheduler
    assert "reductionFactor" in scheduler and "keep the top 1/reductionFactor" in scheduler, scheduler
    phase = kubectl("explain", "trial.status.phase").stdout
    assert "Pending, Queued, Running, Paused, Succeeded, Failed or Stopped" in phase, phase
    # what kubectl explain reads: the published OpenAPI v3, one description per property
    published = json.loads(kubectl("get", "--raw", "/openapi/v3/apis/kubetune.dev/v1alpha1").stdout)
    schemas = published["components"]["schemas"]
    missing = []

    def walk(schema, path):
        for name, prop in (schema.get("properties") or {}).items():
            if "$ref" in prop or "allOf" in prop:       # metadata: the standard ObjectMeta
                continue
            if not prop.get("description"):
                missing.append(f"{path}.{name}")
            walk(prop, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(schema.get(key), dict):
                walk(schema[key], f"{path}.{key}")

    for kind in ("Experiment", "Trial"):
        walk(schemas[f"dev.kubetune.v1alpha1.{kind}"], kind)
    assert not missing, missing
