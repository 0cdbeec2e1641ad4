"""Which methods run on which suite: kubetune's pairings and the peers', by name.

A name is ``<side> <what>``: the side is kubetune, optuna, synetune, raytune or RS; every method
of a suite runs on the same problems, seeds, workers and budget.
"""
from __future__ import annotations

from typing import Callable

from kubetune.bench.quality.peers import (OptunaPeer, RandomPeer, RayTunePeer, SyneTunePeer, ray_tune_available,
                                          syne_tune_available)
from kubetune.bench.quality.problems import BB, MF, MO, Problem
from kubetune.bench.quality.timeline import WORKERS, Trace, run_ask_tell, run_kubetune
from kubetune.core.samplers import missing_packages

Runner = Callable[[Problem, int], Trace]

RS, RS2 = "RS", "RS x2"


def _pairings(suite: str, quick: bool) -> list[tuple[str, str]]:
    """(search algorithm, scheduler) pairs run by kubetune and by in-process Optuna."""
    if suite == MF:
        return [("random", "asha"), ("tpe", "asha")] + ([] if quick else [("tpe", "hyperband")])
    if suite == BB:
        pairs = [("tpe", "fifo")] + ([] if quick else [("cmaes", "fifo")])
        if not quick and not missing_packages("gp"):
            pairs.append(("gp", "fifo"))
        return pairs
    return [("nsgaii", "fifo")] + ([] if quick else [("tpe", "fifo")])


def label(algorithm: str, scheduler: str) -> str:
    return algorithm if scheduler == "fifo" else f"{scheduler}+{algorithm}"


def methods(suite: str, quick: bool) -> dict[str, Runner]:
    table: dict[str, Runner] = {}
    for algorithm, scheduler in _pairings(suite, quick):
        name = label(algorithm, scheduler)
        table[f"kubetune {name}"] = lambda p, s, a=algorithm, c=scheduler: run_kubetune(p, a, c, s)
        table[f"optuna {name}"] = lambda p, s, a=algorithm, c=scheduler: run_ask_tell(p, OptunaPeer(p, a, c, s))
    # search.algorithm auto against today's default (random), under the suite's scheduler
    scheduler = "asha" if suite == MF else "fifo"
    for algorithm in ("auto", "random"):
        table.setdefault(f"kubetune {label(algorithm, scheduler)}",
                         lambda p, s, a=algorithm, c=scheduler: run_kubetune(p, a, c, s))
    if suite == MF and not quick and syne_tune_available():
        for method in ("asha", "bohb"):
            table[f"synetune {method}"] = lambda p, s, m=method: run_ask_tell(p, SyneTunePeer(p, m, s))
    if suite == MF and not quick and ray_tune_available():
        for algorithm in ("random", "tpe"):
            table[f"raytune asha+{algorithm}"] = lambda p, s, a=algorithm: run_ask_tell(p, RayTunePeer(p, a, s))
    table[RS] = lambda p, s: run_ask_tell(p, RandomPeer(p, s))
    table[RS2] = lambda p, s: run_ask_tell(p, RandomPeer(p, s), workers=2 * WORKERS)
    return table


def side(method: str) -> str:
    return method.split(" ", 1)[0]


def default_twin(method: str) -> str | None:
    """For ``kubetune <scheduler>+auto``: the same with today's default, random search."""
    if side(method) == "kubetune" and method.endswith("auto"):
        return method[: -len("auto")] + "random"
    return None


def optuna_twin(method: str) -> str | None:
    """The in-process Optuna method with kubetune's sampler and pruner."""
    return f"optuna {method.split(' ', 1)[1]}" if side(method) == "kubetune" else None
