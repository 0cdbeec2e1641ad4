"""The size bounds of issue 31 (docs/explanation/design.md: Layout): no module under
controller/, core/ or executors/ has more than 400 lines, and no function under
controller/ or core/ more than 60.

A module that outgrows the bound has taken a second job: split it along that seam (as
core/runner.py -> runner_events.py, runner_restart.py, budget.py) rather than raise the
bound.  Each rule is also run on a planted violation, so a checker that stopped seeing
functions fails here instead of passing forever.
"""
from __future__ import annotations

import ast
import pathlib

import kubetune

PACKAGE = pathlib.Path(kubetune.__file__).parent
BOUNDED = ("controller", "core")                   # modules and functions
LINE_BOUNDED = BOUNDED + ("executors",)            # modules
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def oversized(source: str) -> tuple[int | None, dict[str, int]]:
    """(the module's line count if over the bound, else None; {function: lines} over the bound)."""
    lines = len(source.splitlines())
    functions = {node.name: node.end_lineno - node.lineno + 1
                 for node in ast.walk(ast.parse(source))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    return (lines if lines > MAX_MODULE_LINES else None), functions


def bounded_modules(folders: tuple[str, ...] = BOUNDED) -> list[pathlib.Path]:
    return sorted(path for folder in folders for path in (PACKAGE / folder).rglob("*.py"))


def test_the_bounded_folders_hold_modules():
    assert len(bounded_modules()) > 20
    assert len(bounded_modules(("executors",))) > 20


def test_no_module_over_400_lines():
    too_long = {str(p.relative_to(PACKAGE)): n for p in bounded_modules(LINE_BOUNDED)
                if (n := oversized(p.read_text())[0]) is not None}
    assert too_long == {}, "split these along a seam (one job per module)"


def test_no_function_over_60_lines():
    too_long = {f"{p.relative_to(PACKAGE)}:{name}": n for p in bounded_modules()
                for name, n in oversized(p.read_text())[1].items()}
    assert too_long == {}, "split these functions"


def test_the_checker_sees_a_planted_violation():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    planted = f"async def long_one():\n{body}\n\n\ndef short():\n    return 1\n"
    assert oversized(planted) == (None, {"long_one": MAX_FUNCTION_LINES + 1})
    assert oversized("x = 1\n" * (MAX_MODULE_LINES + 1))[0] == MAX_MODULE_LINES + 1
    assert oversized("x = 1\n" * MAX_MODULE_LINES) == (None, {})
