"""The search space as Optuna distributions, and the Optuna sampler of each
``spec.search.algorithm``, seeded per ask (``reseed``) so a restarted operator suggests
what it would have without the restart.  Pure: no I/O."""
from __future__ import annotations

import hashlib
import importlib.util
import math
import random
import warnings
from typing import Any, Callable, Mapping

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from kubetune.core import optuna_compat
from kubetune.spec.model import ALGORITHMS, DISTRIBUTIONS, Param, SpecError

# Samplers whose Optuna implementation imports packages kubetune does not depend on.
OPTIONAL_PACKAGES = {"cmaes": ("cmaes",), "gp": ("torch", "scipy"), "qmc": ("scipy",)}


def missing_packages(algorithm: str) -> list[str]:
    return [name for name in OPTIONAL_PACKAGES.get(algorithm, ()) if importlib.util.find_spec(name) is None]


def to_distribution(param: Param) -> BaseDistribution:
    if param.kind == "uniform":
        return FloatDistribution(param.low, param.high)
    if param.kind == "loguniform":
        return FloatDistribution(param.low, param.high, log=True)
    if param.kind == "randint":
        return IntDistribution(param.low, param.high - 1)      # Ray Tune's randint excludes high
    if param.kind == "quniform":
        # Optuna wants high reachable from low in whole steps; use the last step below high.
        top = param.grid_value(param.grid_size() - 1)
        if param.is_integer:
            return IntDistribution(param.low, top, step=param.q)
        return FloatDistribution(param.low, top, step=param.q)
    if param.kind == "choice":
        return CategoricalDistribution(param.choices)
    if param.kind == "ordinal":
        # its position in the list (to_study/from_study): a CategoricalDistribution would
        # be unordered, which CMA-ES and GP do not search (Optuna samples it at random)
        # and TPE treats as unrelated labels
        return IntDistribution(0, len(param.choices) - 1)
    raise ValueError(f"unknown distribution {param.kind!r}; known: {', '.join(DISTRIBUTIONS)}")


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler stops the study from ``after_trial`` once every point is done, which
    raises outside ``study.optimize``; with ask/tell the Searcher counts the grid itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def ask_seed(seed: int, index: int) -> int:
    """The seed of the ``index``-th suggestion: a hash of (seed, index). Consecutive
    integers seed Mersenne Twister states whose first draws are correlated: random search
    reseeded with seed*1000003+index found a best of 150 draws 2.4x further from the optimum
    (median over 40 seeds) than unseeded draws (python -m kubetune.bench.quality, T2)."""
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def reseed(sampler: optuna.samplers.BaseSampler, seed: int) -> None:
    """Seed every random state of ``sampler`` (and of the samplers it holds, such as
    TPE's startup sampler).  Done before each ask with a seed from (spec seed, trial
    index): the parameters of trial n depend only on the seed and the study, which
    ``rebuild`` restores exactly, so a restarted operator suggests what it would have
    without the restart (and never replays the first trials' parameters)."""
    for value in vars(sampler).values():
        if isinstance(value, optuna_compat.LazyRandomState):
            value.rng.seed(seed)
        elif isinstance(value, optuna.samplers.BaseSampler):
            reseed(value, seed)


def make_sampler(algorithm: str, seed: int | None, *, grid: dict[str, list[Any]] | None, grid_seed: int | None,
                 cma_source_trials: Callable[[], list[optuna.trial.FrozenTrial] | None]) -> optuna.samplers.BaseSampler:
    """The sampler ``spec.search.algorithm`` names; never a silent fallback to another."""
    samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        "grid": lambda: _AskTellGridSampler(grid, seed=grid_seed),
        # constant_liar: running trials count as bad results, so parallel asks
        # do not all land on the same promising point.
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True),
        "nsgaii": lambda: optuna.samplers.NSGAIISampler(seed=seed),
        # warm start: CMA-ES starts from the earlier trials' promising region (Optuna's
        # warm-starting CMA-ES, Nomura et al. AAAI 2021); the study's trials alone do not
        # move it (it reads only the trials of its own generations)
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, consider_pruned_trials=True,
                                                      warn_independent_sampling=False,
                                                      source_trials=cma_source_trials()),
        "gp": lambda: optuna.samplers.GPSampler(seed=seed),
        # scrambled; a restart skips the points used before (see rebuild)
        "qmc": lambda: optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False),
    }
    if algorithm not in samplers:   # never a silent fallback to another algorithm
        raise SpecError("spec.search.algorithm",
                        f"unknown algorithm {algorithm!r}; use one of: {', '.join(ALGORITHMS)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return samplers[algorithm]()


def shown_distribution(param: Param) -> BaseDistribution:
    """The distribution of the values trials run, for the dashboard: an ordinal's list."""
    return CategoricalDistribution(param.choices) if param.kind == "ordinal" else to_distribution(param)


def to_study(space: Mapping[str, Param], params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as the study holds them: an ordinal as its position in its list.
    ValueError for a value the space does not list."""
    return {name: space[name].choices.index(_listed(space[name], value)) if name in space and
            space[name].kind == "ordinal" else value for name, value in params.items()}


def from_study(space: Mapping[str, Param], params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as a trial runs them: an ordinal's position back to its value."""
    return {name: space[name].choices[value] if name in space and space[name].kind == "ordinal" else value
            for name, value in params.items()}


def contains(param: Param, distribution: BaseDistribution, value: Any) -> bool:
    """Whether a trial's ``value`` (as it runs) lies in the parameter's space."""
    return param.contains(value) if param.kind == "ordinal" else optuna_compat.contains(distribution, value)


def _listed(param: Param, value: Any) -> Any:
    if not param.contains(value):
        raise ValueError(f"{value!r} is not one of {list(param.choices)}")
    return value


# warm-starting CMA-ES needs this many earlier trials (it starts from their best 10%)
WS_CMA_MIN_TRIALS = 10


def cma_source_trials(trials: list[optuna.trial.FrozenTrial],
                      distributions: dict[str, BaseDistribution]) -> list[optuna.trial.FrozenTrial] | None:
    """The warm-start trials as WS-CMA-ES's ``source_trials``, or None when it cannot use them.
    It fits its start to the best 10% of them (cmaes' get_warm_start_mgd, gamma 0.1):
    fewer than 10 select none, and it refuses."""
    if len(trials) < WS_CMA_MIN_TRIALS:
        return None
    # CMA-ES searches only the numeric parameters with more than one value (a choice,
    # or a range a bounding box narrowed to one value, is sampled on its own), and
    # accepts a source trial only if its parameters are exactly those: otherwise it
    # raises "No compatible source_trials" on every ask.
    cma_space = {name: d for name, d in distributions.items()
                 if isinstance(d, (FloatDistribution, IntDistribution)) and not d.single()}
    if not cma_space:
        return None
    return [optuna.trial.create_trial(
        state=t.state, values=t.values, params={n: t.params[n] for n in cma_space},
        distributions=cma_space, user_attrs=t.user_attrs, system_attrs=t.system_attrs) for t in trials]


def resample(param: Param, rng: random.Random) -> Any:
    """A fresh value for one parameter, independent of the study (PBT's explore step)."""
    if param.kind == "uniform":
        return rng.uniform(param.low, param.high)
    if param.kind == "loguniform":
        return math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
    if param.kind in ("quniform", "randint"):
        # the same draw as rng.choice(grid_values()), without building the grid
        return param.grid_value(rng.randrange(param.grid_size()))
    return rng.choice(param.choices)
