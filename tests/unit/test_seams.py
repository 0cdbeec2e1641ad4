"""The seams between kubetune's packages, read from the source (docs/explanation/design.md: Layout; CONTRIBUTING.md):

- the controller imports no Ray: it asks its ``Platform`` (``classify``) what a
  platform's error means; of executors/ it imports the protocols (base.py,
  platform.py) only;
- only k8s/ (and the dev tools devcluster/ and bench/) imports the Kubernetes client:
  everything else calls k8s/'s typed functions;
- no import cycle between packages (a package is a folder under kubetune/, or a
  top-level module such as handlers.py);
- the controller never chooses a platform (no ``isinstance`` on a handle, no
  ``executor == "pod"``, no ``getattr`` past a protocol);
- core/ names no platform (neither Kueue nor Ray: executors/ parses their objects);

Each rule is checked against the tree and against a planted violation, so a rule
that stopped seeing imports would fail here rather than pass forever.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

import kubetune

PACKAGE = pathlib.Path(kubetune.__file__).parent


def imported_modules(source: str) -> set[str]:
    """Every absolute module name ``source`` imports, at any depth (lazy imports inside
    functions count: they are the ones that hide a dependency)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            # ``from kubetune import metrics`` imports the module kubetune.metrics
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def unit_of(module: str) -> str | None:
    """The package (or top-level module) of ``kubetune.x.y``: ``x``; None outside kubetune."""
    parts = module.split(".")
    if parts[0] != "kubetune":
        return None
    if len(parts) == 1:
        return "kubetune"
    name = parts[1]
    if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file():
        return name
    return "kubetune"           # a name the root package exports (from kubetune import report)


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        source = "kubetune" if parts == ("__init__",) else parts[0]
        targets = {unit_of(name) for name in imported_modules(path.read_text())}
        graph.setdefault(source, set()).update(t for t in targets if t and t != source)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def modules_importing(prefixes: tuple[str, ...], under: str) -> dict[str, set[str]]:
    """{module path: the names it imports that start with one of ``prefixes``}, for the
    modules under ``under`` (a folder of kubetune/)."""
    found: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / under).rglob("*.py")):
        bad = {name for name in imported_modules(path.read_text())
               if any(name == p or name.startswith(p + ".") for p in prefixes)}
        if bad:
            found[str(path.relative_to(PACKAGE))] = bad
    return found


def test_controller_imports_no_ray():
    assert list((PACKAGE / "controller").rglob("*.py"))
    assert modules_importing(("ray",), "controller") == {}


def test_controller_imports_no_platform_package():
    """Of executors/, the controller knows the protocols only; the operator (handlers.py)
    and ``kubetune run`` hand it the platforms."""
    found = modules_importing(("kubetune.executors",), "controller")
    platform = {path: {n for n in names if not n.startswith(("kubetune.executors.base", "kubetune.executors.platform"))}
                for path, names in found.items()}
    assert {path: names for path, names in platform.items() if names} == {}
    assert found, "the controller should use the executor protocol (executors.base)"


def test_the_ray_rule_sees_the_ray_executor():
    found = modules_importing(("ray",), "executors")
    assert "ray.exceptions" in found["executors/ray/errors.py"]
    assert "ray" in found["executors/ray/executor.py"]


KUBERNETES_ALLOWED = {"k8s", "devcluster", "bench"}


def test_only_k8s_imports_the_kubernetes_client():
    outside = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1 and parts[0] in KUBERNETES_ALLOWED:
            continue
        bad = {name for name in imported_modules(path.read_text())
               if name == "kubernetes" or name.startswith("kubernetes.")}
        if bad:
            outside[str(path.relative_to(PACKAGE))] = bad
    assert outside == {}


def test_the_kubernetes_rule_sees_k8s():
    assert "kubernetes" in modules_importing(("kubernetes",), "k8s")["k8s/pods.py"]


def test_no_import_cycle_between_packages():
    graph = package_graph()
    assert {"controller", "core", "executors", "k8s", "spec", "trainable"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_cycle_finder_sees_a_planted_cycle():
    graph = package_graph()
    graph.setdefault("trainable", set()).add("executors")        # pod_session -> stdout_results, once
    graph.setdefault("executors", set()).add("trainable")
    assert find_cycle(graph) is not None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_lazy_and_from_imports_are_seen():
    source = "def f():\n    import ray.exceptions\n\nfrom kubetune import metrics\n"
    assert {"ray.exceptions", "kubetune.metrics"} <= imported_modules(source)
    assert unit_of("kubetune.metrics") == "metrics"
    assert unit_of("kubetune.executors.ray.executor") == "executors"


# Choosing a platform by its type or name, or reaching past the Platform protocol
# (issue 31's grep): the controller holds a Platform and never asks which one.
PLATFORM_CHOICE = re.compile(r'isinstance\(.*ClusterHandle|executor == "pod"|getattr\(')


def platform_choices(under: pathlib.Path) -> dict[str, list[str]]:
    """{file: its lines that choose a platform}, for the Python files under ``under``."""
    found: dict[str, list[str]] = {}
    for path in sorted(under.rglob("*.py")):
        lines = [line.strip() for line in path.read_text().splitlines() if PLATFORM_CHOICE.search(line)]
        if lines:
            found[path.name] = lines
    return found


def test_the_controller_never_asks_which_platform():
    assert platform_choices(PACKAGE / "controller") == {}


def test_the_platform_choice_rule_sees_a_planted_violation(tmp_path):
    (tmp_path / "planted.py").write_text(
        'if spec.executor == "pod":\n    pass\n'
        'close = getattr(executor, "close", None)\n'
        'if isinstance(cluster, ClusterHandle):\n    pass\n'
        'platform = registry.platform_for(spec)\n')
    assert platform_choices(tmp_path) == {"planted.py": [
        'if spec.executor == "pod":', 'close = getattr(executor, "close", None)',
        'if isinstance(cluster, ClusterHandle):']}


# core/ is platform-neutral: Kueue's objects are parsed in executors/pods/kueue.py and
# Ray's in executors/ray/; "Ray Tune" (the lineage of the runner's hooks) is no platform.
PLATFORM_NAMES = re.compile(r"\bkueue\b|\bray\b(?! tune)", re.IGNORECASE)


def platform_names(under: pathlib.Path) -> dict[str, list[str]]:
    """{file: its lines that name a platform}, for the Python files under ``under``."""
    found: dict[str, list[str]] = {}
    for path in sorted(under.rglob("*.py")):
        lines = [line.strip() for line in path.read_text().splitlines() if PLATFORM_NAMES.search(line)]
        if lines:
            found[str(path.relative_to(under))] = lines
    return found


def test_core_names_neither_kueue_nor_ray():
    assert platform_names(PACKAGE / "core") == {}


def test_the_platform_name_rule_sees_a_planted_violation(tmp_path):
    (tmp_path / "planted.py").write_text(
        "import ray\n"
        "# waits for Kueue admission\n"
        'QUEUE = "kueue.x-k8s.io/queue-name"\n'
        "# the scheduler hooks of Ray Tune\n"
        "array = [1]\n")
    assert platform_names(tmp_path) == {"planted.py": [
        "import ray", "# waits for Kueue admission", 'QUEUE = "kueue.x-k8s.io/queue-name"']}


def test_keys_are_composed_and_taken_apart_by_their_types():
    from kubetune.spec.trial_key import ExperimentKey, TrialKey
    key = TrialKey("ns", "exp", "exp-0")
    assert TrialKey.parse(str(key)) == key and key.experiment_prefix == "ns/exp/"
    assert ExperimentKey.parse(key.experiment_prefix) == ExperimentKey.parse(str(key)) == ("ns", "exp")
    assert str(ExperimentKey("ns", "exp")) == "ns/exp/"
    for broken in ("", "ns", "ns/", "/exp/"):
        with pytest.raises(ValueError):
            ExperimentKey.parse(broken)
