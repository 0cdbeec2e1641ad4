"""A sampling lambda read as a distribution, when it is one of the few exact forms
(``lambda: random.uniform(1e-4, 1e-2)``, ``lambda spec: np.random.choice([1, 2])``, ...):
PBT's ``hyperparam_mutations`` and ``tune.sample_from`` often hold one.  Any other
lambda returns None, and the caller refuses it by name."""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable

# the called function's last dotted names -> how its literal arguments map
_FORMS = {
    ("random", "uniform"): "uniform", ("np.random", "uniform"): "uniform",
    ("numpy.random", "uniform"): "uniform",
    ("random", "randint"): "randint_inclusive",          # random.randint(a, b) includes b
    ("np.random", "randint"): "randint", ("numpy.random", "randint"): "randint",
    ("random", "choice"): "choice", ("np.random", "choice"): "choice", ("numpy.random", "choice"): "choice",
}


def where(function: Callable[..., Any]) -> str:
    code = getattr(function, "__code__", None)
    if code is None:
        return "?"
    import os
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def as_distribution(function: Callable[..., Any]) -> dict[str, list] | None:
    """``{"uniform": [a, b]}`` and the like, or None when ``function`` is no exact form."""
    code = getattr(function, "__code__", None)
    if code is None or function.__name__ != "<lambda>":
        return None
    try:
        lines, _ = inspect.findsource(code)
        tree = ast.parse("".join(lines))
    except (OSError, SyntaxError, TypeError):
        return None
    found = [node for node in ast.walk(tree) if isinstance(node, ast.Lambda)
             and node.lineno == code.co_firstlineno]
    if len(found) != 1:         # two lambdas on one line: cannot tell which
        return None
    body = found[0].body
    if not isinstance(body, ast.Call) or body.keywords:
        return None
    name = ast.unparse(body.func)
    owner, _, attribute = name.rpartition(".")
    form = _FORMS.get((owner, attribute))
    try:
        values = [ast.literal_eval(arg) for arg in body.args]
    except ValueError:
        return None
    if form == "uniform" and len(values) == 2:
        return {"uniform": [float(values[0]), float(values[1])]}
    if form in ("randint", "randint_inclusive") and len(values) == 2 and all(isinstance(v, int) for v in values):
        return {"randint": [values[0], values[1] + (1 if form == "randint_inclusive" else 0)]}
    if form == "choice" and len(values) == 1 and isinstance(values[0], (list, tuple)) and values[0]:
        return {"choice": list(values[0])}
    return None
