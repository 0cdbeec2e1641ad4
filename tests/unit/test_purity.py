"""core/ and spec/ are pure: no Ray, no Kubernetes, no clock, no I/O (docs/explanation/design.md: Layout)."""
import ast
import pathlib

import pytest

import kubetune

PACKAGE = pathlib.Path(kubetune.__file__).parent
FORBIDDEN = {"ray", "kubernetes", "kopf", "time", "datetime", "os", "subprocess", "socket", "asyncio",
             "threading", "requests", "urllib", "shutil", "pathlib", "kubetune.executors", "kubetune.k8s",
             "kubetune.controller", "kubetune.trainable"}
MODULES = sorted(p for d in ("core", "spec") for p in (PACKAGE / d).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_modules_import_nothing_with_side_effects(path):
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "open", f"{path.name} opens a file"
    bad = {name for name in imported if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)}
    assert not bad, f"{path.name} imports {bad}"
