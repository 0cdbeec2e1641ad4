"""Static checks of what ships: the Dockerfile (no Docker engine here to build it),
the chart's CRDs (the repository's crds/, not a drifting copy), the Ray version
pairing across Dockerfile, pyproject, chart and the KubeRay example."""
from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from kubetune.spec import parse_experiment

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kubetune"


# ------------------------------------------------------------------ a small Dockerfile reader

@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def read_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) with continuation lines joined and comments dropped."""
    logical, current = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):      # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert match, f"unparsable FROM: {line}"
            stages.append(Stage(_expand(match.group(1), global_args), match.group(2)))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM: {line}"
            name, _, default = args.partition("=")
            global_args[name] = _expand(default.strip('"'), global_args)
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


def _expand(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), text)


@pytest.fixture(scope="module")
def dockerfile():
    return read_dockerfile(REPO / "Dockerfile")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def ray_requirement() -> Requirement:
    [ray] = [Requirement(d) for d in pyproject()["project"]["dependencies"] if Requirement(d).name == "ray"]
    return ray


# ------------------------------------------------------------------ Dockerfile

def test_final_stage_is_python_311_slim(dockerfile):
    global_args, stages = dockerfile
    assert len(stages) >= 2, "multi-stage: build tools stay out of the final image"
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", stages[-1].base), stages[-1].base
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", stages[0].base), stages[0].base


def test_final_stage_runs_as_non_root(dockerfile):
    _, stages = dockerfile
    [user] = stages[-1].all("USER")[-1:]
    uid = user.split(":")[0]
    assert uid not in {"0", "root"} and (not uid.isdigit() or int(uid) >= 1000), user


def test_entrypoint_is_kubetune_operator(dockerfile):
    _, stages = dockerfile
    [entrypoint] = stages[-1].all("ENTRYPOINT")[-1:]
    assert yaml.safe_load(entrypoint) == ["kubetune", "operator"]   # exec form: signals reach kopf


def test_final_stage_has_no_build_tools(dockerfile):
    _, stages = dockerfile
    final = stages[-1]
    commands = " ".join(final.all("RUN"))
    for tool in ("apt-get install", "apt install", "gcc", "build-essential", "make ", "pip install", "go build"):
        assert tool not in commands, f"the final stage runs {tool!r}"
    copies = final.all("COPY")
    assert any(c.startswith("--from=build ") for c in copies), "the final stage takes the venv from `build`"


def test_crds_are_in_the_image_and_found_there(dockerfile):
    _, stages = dockerfile
    final = stages[-1]
    [crds_copy] = [c for c in final.all("COPY") if shlex.split(c)[0].rstrip("/") == "crds"]
    destination = shlex.split(crds_copy)[-1].rstrip("/")
    env = " ".join(final.all("ENV"))
    assert f"KUBETUNE_CRDS_DIR={destination}" in env


def test_ray_pin_matches_pyproject(dockerfile):
    global_args, stages = dockerfile
    version = global_args["RAY_VERSION"]
    assert ray_requirement().specifier.contains(version), (version, str(ray_requirement().specifier))
    build = " ".join(stages[0].all("RUN"))
    assert '"ray[default]==${RAY_VERSION}"' in build
    assert global_args["RAY_IMAGE"] == f"rayproject/ray:{version}-py311"


def test_dockerignore_keeps_what_the_build_copies():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not ignored & {"operator", "crds", "pyproject.toml", "README.md"}


# ------------------------------------------------------------------ chart

def test_chart_crds_are_the_repository_crds_byte_for_byte():
    repository = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert chart == repository and repository
    for name in repository:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), name


def test_chart_versions_pair_with_the_image(dockerfile):
    global_args, _ = dockerfile
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == pyproject()["project"]["version"]
    assert chart["annotations"]["kubetune.dev/ray-version"] == global_args["RAY_VERSION"]


# ------------------------------------------------------------------ KubeRay example

def test_kuberay_example_pairs_with_the_image_and_scales_gpus_from_zero(dockerfile):
    global_args, _ = dockerfile
    cluster = yaml.safe_load((REPO / "examples" / "kuberay" / "raycluster.yaml").read_text())
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["kind"] == "RayCluster"
    spec = cluster["spec"]
    assert spec["rayVersion"] == global_args["RAY_VERSION"]
    assert spec["enableInTreeAutoscaling"] is True
    [gpu] = [g for g in spec["workerGroupSpecs"] if any(
        "nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {}) for c in g["template"]["spec"]["containers"])]
    assert gpu["minReplicas"] == 0 and gpu["maxReplicas"] >= 1
    head_ports = {p["containerPort"] for c in spec["headGroupSpec"]["template"]["spec"]["containers"]
                  for p in c.get("ports", [])}
    assert 10001 in head_ports   # Ray Client, which the operator connects to

    experiment = yaml.safe_load((REPO / "examples" / "kuberay" / "experiment.yaml").read_text())
    parsed = parse_experiment(experiment["spec"])
    assert parsed.trial.resources.gpu >= 1
    assert parsed.ray.address == f"ray://{cluster['metadata']['name']}-head-svc.default.svc:10001"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["ray"]["address"] == parsed.ray.address   # the chart's default is that cluster


def test_e2e_manifests_stay_valid():
    """`make e2e` (tests/e2e/kind_e2e.py) shrinks the KubeRay example for kind; what it
    applies must still be a valid Experiment, CPU-only, on the same Ray address."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("kind_e2e", REPO / "tests" / "e2e" / "kind_e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cluster, experiment = module.laptop_manifests()
    parsed = parse_experiment(experiment["spec"])
    assert parsed.trial.resources.gpu == 0 and parsed.ray.address == module.RAY_ADDRESS
    images = {c["image"] for g in [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
              for c in g["template"]["spec"]["containers"]}
    assert images == {f"kubetune-ray:{module.TAG}"}
