"""Ray Tune's search space (``param_space``, PBT's ``hyperparam_mutations``) as kubetune's
``searchSpace``: each Ray domain maps to a distribution, or is refused by name with the line
it came from; constants go to ``spec.trial.config``."""
from __future__ import annotations

import json
from typing import Any

from kubetune.convert import lambdas
from kubetune.convert.common import Conversion
from kubetune.convert.raytune_capture import LINE, Captured


def mutations(mutations: dict, where: str, conv: Conversion) -> dict[str, Any]:
    out = {}
    for name, value in mutations.items():
        mapped = domain(value, f"hyperparam_mutations[{name!r}]", where, conv)
        if mapped is not None:
            out[name] = mapped
    return out


def is_grid(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"grid_search"}


def all_grid(space: dict) -> bool:
    return all(is_grid(v) or not is_domain(v) for v in space.values())


def is_domain(value: Any) -> bool:
    from ray.tune.search.sample import Domain
    return isinstance(value, Domain) or is_grid(value)


def param_space(space: dict, c: Captured, conv: Conversion, scheduler: str | None):
    params: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    grid_size = 0
    for name, value in space.items():
        if is_grid(value):
            values = list(value["grid_search"])
            params[name] = {"choice": values}
            grid_size = (grid_size or 1) * len(values)
        elif is_domain(value):
            mapped = domain(value, f"param_space[{name!r}]", c.line, conv)
            if mapped is not None:
                params[name] = mapped
        elif isinstance(value, dict) and any(is_domain(v) for v in value.values()):
            conv.refuse(f"param_space[{name!r}] (nested)", c.line,
                        "kubetune's searchSpace is flat: move the nested parameters to the top level")
        else:
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                conv.refuse(f"param_space[{name!r}] = {type(value).__name__}", c.line,
                            "a constant in spec.trial.config must be JSON (numbers, strings, lists, dicts)")
                continue
            constants[name] = value
    if grid_size and not all_grid(space):
        conv.note("grid_search next to sampled parameters: each grid value is a choice, and maxTrials is "
                  "num_samples x the grid's size, as in Ray; kubetune samples the grid values instead of "
                  "enumerating them once per sample")
    if scheduler == "pbt":
        for name in list(params):
            conv.note(f"PBT: {name} is sampled from the searchSpace for the first trials (Ray starts from "
                      "param_space's value)")
    return params, constants, grid_size


def domain(value: Any, what: str, where: str, conv: Conversion) -> dict[str, Any] | None:
    from ray.tune.search import sample
    if isinstance(value, (list, tuple)):
        return {"choice": list(value)} if value else None
    if callable(value) and not isinstance(value, sample.Domain):
        mapped = lambdas.as_distribution(value)
        if mapped is None:
            conv.refuse(f"{what} = <function>", lambdas.where(value),
                        "only lambda: random.uniform(a, b) / random.randint(a, b) / random.choice([...]) "
                        "(or np.random's) map to a distribution; use tune.uniform(...) & co.")
        return mapped
    if is_grid(value):
        return {"choice": list(value["grid_search"])}
    if isinstance(value, sample.Function):
        mapped = lambdas.as_distribution(value.func)
        if mapped is None:
            conv.refuse(f"{what} = tune.sample_from(...)", getattr(value, LINE, where),
                        "an arbitrary sampling function has no kubetune equivalent; use tune.uniform(...) & co.")
        return mapped
    if isinstance(value, sample.Categorical):
        return {"choice": list(value.categories)}
    sampler = value.get_sampler() if hasattr(value, "get_sampler") else None
    q = None
    if isinstance(sampler, sample.Quantized):
        q, sampler = sampler.q, sampler.get_sampler()
    if isinstance(sampler, sample.Normal):
        conv.refuse(f"{what} = tune.randn(...)", where, "kubetune has no normal distribution; use tune.uniform")
        return None
    log = isinstance(sampler, sample.LogUniform)
    integer = isinstance(value, sample.Integer)
    low, high = value.lower, value.upper
    if q is not None:
        if log:
            conv.refuse(f"{what} = tune.qloguniform/qlograndint(...)", where,
                        "kubetune has no quantized log scale; use tune.loguniform or tune.qrandint")
            return None
        if integer:      # Ray's qrandint includes upper
            return {"quniform": [int(low), int(high), int(q)]}
        return {"quniform": [low, high, q]}
    if integer:
        if log:
            conv.refuse(f"{what} = tune.lograndint(...)", where,
                        "kubetune has no integer log scale; use tune.randint or tune.loguniform")
            return None
        return {"randint": [int(low), int(high)]}
    return {"loguniform" if log else "uniform": [low, high]}
