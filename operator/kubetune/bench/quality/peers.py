"""The peers, each behind the ask/tell interface of ``timeline.run_ask_tell``.

- ``OptunaPeer``: Optuna in-process with the very sampler kubetune builds for the same
  spec (taken from kubetune's own ``Searcher``) and the pruner kubetune's scheduler wraps
  (``SuccessiveHalvingPruner`` for ASHA, ``HyperbandPruner`` for HyperBand). kubetune
  must not lose what Optuna has.
- ``SyneTunePeer``: Syne Tune's ASHA and BOHB schedulers (``syne_tune.optimizer.baselines``),
  driven through their scheduler API (suggest / on_trial_result / on_trial_complete) by
  the same event loop as everyone else: what Syne Tune's simulator backend does, on the
  same clock.
- ``RayTunePeer``: Ray Tune's ``ASHAScheduler`` with ``OptunaSearch`` (TPE, or random),
  each with Ray's defaults as a Ray Tune user gets them, driven through their own
  callbacks (``suggest`` / ``on_trial_result`` / ``on_trial_complete``) on the same clock.
  Ray Tune has no simulated-time backend; running its ``Tuner`` for real would take the
  budget in wall-clock seconds, so this drives the two objects its controller drives.
- ``RandomPeer``: random search, every trial to the highest fidelity. RS x2 is the same
  with twice the workers: twice the budget at every point in time.
"""
from __future__ import annotations

import math
import random
from typing import Any, Mapping

import optuna

from kubetune.bench.quality.problems import Problem, draw
from kubetune.bench.quality.timeline import MAX_TRIALS, experiment_name, kubetune_spec
from kubetune.core.samplers import ask_seed, from_study, reseed
from kubetune.core.search import Searcher
from kubetune.spec import parse_experiment

optuna.logging.set_verbosity(optuna.logging.WARNING)


class RandomPeer:
    def __init__(self, problem: Problem, seed: int) -> None:
        self.space, self.rng, self.count = problem.space, random.Random(seed), 0

    def ask(self):
        self.count += 1
        return self.count, draw(self.space, self.rng)

    def report(self, handle, iteration, metrics) -> bool:
        return True

    def finish(self, handle, metrics, stopped) -> None:
        pass


class OptunaPeer:
    """``mirror``: also seed each ask as kubetune does (``ask_seed``), name the study as
    kubetune's (HyperBand's brackets hash it) and reuse the results of a configuration
    already completed as kubetune does (a Reused Trial, core/runner.py): then the two can
    differ only by what else the operator adds between the algorithm and the trials, and
    must decide the same (tests/unit/test_quality_bench.py).
    The benchmark runs Optuna as a user would: none of this."""

    def __init__(self, problem: Problem, algorithm: str, scheduler: str, seed: int, mirror: bool = False) -> None:
        spec = parse_experiment(kubetune_spec(problem, algorithm, scheduler, seed, 8))
        sampler = Searcher(spec, study_name="peer").study.sampler      # kubetune's own sampler, as built
        pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
        if scheduler == "asha":
            pruner = optuna.pruners.SuccessiveHalvingPruner(
                min_resource=problem.grace_period, reduction_factor=3, min_early_stopping_rate=0)
        elif scheduler == "hyperband":
            pruner = optuna.pruners.HyperbandPruner(
                min_resource=problem.grace_period, max_resource=problem.max_iterations, reduction_factor=3)
        self.problem = problem
        self.space, self.distributions = spec.search_space, Searcher(spec, study_name="peer-space").distributions
        self.seed, self.asked = (seed if mirror else None), 0
        self.completed: dict[tuple, list[float]] | None = {} if mirror else None
        self.study = optuna.create_study(
            sampler=sampler, pruner=pruner,
            study_name=experiment_name(problem, algorithm, scheduler, seed) if mirror else None,
            directions=["minimize" if mode == "min" else "maximize" for _, mode in problem.metrics])
        self.multi = len(problem.metrics) > 1

    def ask(self):
        while self.asked < MAX_TRIALS:       # kubetune's maxTrials, reused trials included
            if self.seed is not None:
                reseed(self.study.sampler, ask_seed(self.seed, self.asked))
            self.asked += 1
            trial = self.study.ask(self.distributions)
            earlier = None if self.completed is None else self.completed.get(tuple(sorted(trial.params.items())))
            if earlier is None:
                return trial, from_study(self.space, trial.params)     # an ordinal's position -> its value
            self.study.tell(trial, earlier if self.multi else earlier[0])
        return None

    def report(self, trial, iteration, metrics) -> bool:
        if self.multi:
            return True
        trial.report(metrics[self.problem.objective], iteration)
        return not trial.should_prune()

    def finish(self, trial, metrics, stopped) -> None:
        values = [metrics[m] for m, _ in self.problem.metrics]
        if stopped:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(trial, values if self.multi else values[0])
            if self.completed is not None:
                self.completed[tuple(sorted(trial.params.items()))] = values


def _syne_space(problem: Problem) -> dict[str, Any]:
    from syne_tune.config_space import choice, loguniform, randint, uniform

    space: dict[str, Any] = {}
    for name, dist in problem.space.items():
        (kind, args), = dist.items()
        space[name] = {"uniform": lambda a: uniform(*a), "loguniform": lambda a: loguniform(*a),
                       "randint": lambda a: randint(a[0], a[1] - 1),
                       "choice": lambda a: choice(list(a))}["choice" if kind == "ordinal" else kind](args)
    return space


class SyneTunePeer:
    """Syne Tune 0.16's ASHA or BOHB. Its schedulers want a ``Trial`` per config and the
    resource attribute in every result; they answer CONTINUE / STOP / PAUSE."""

    def __init__(self, problem: Problem, method: str, seed: int) -> None:
        import numpy as np
        from syne_tune.optimizer import baselines

        # Besides its random_seed it draws from the global RNGs: the same seed twice in one
        # process scored 0.2016 then 0.1702 (mfh3-terrible); seeded here, it repeats itself
        np.random.seed(seed)
        random.seed(seed)
        space = _syne_space(problem)
        cls = {"asha": baselines.ASHA, "bohb": baselines.BOHB}[method]
        self.problem = problem
        self.scheduler = cls(space, metric=problem.objective, time_attr="epoch", max_t=problem.max_iterations,
                             do_minimize=problem.minimize, grace_period=problem.grace_period,
                             reduction_factor=3, random_seed=seed)
        self.next_id = 0

    def ask(self):
        from syne_tune.backend.trial_status import Trial

        suggestion = self.scheduler.suggest()
        if suggestion is None or suggestion.config is None:
            return None
        trial = Trial(trial_id=self.next_id, config=suggestion.config, creation_time=None)
        self.next_id += 1
        self.scheduler.on_trial_add(trial)
        params = {k: v for k, v in suggestion.config.items() if k in self.problem.space}
        return trial, params

    def _result(self, iteration: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        return {self.problem.objective: metrics[self.problem.objective], "epoch": iteration}

    def report(self, trial, iteration, metrics) -> bool:
        decision = self.scheduler.on_trial_result(trial, self._result(iteration, metrics))
        return str(decision).lower().endswith("continue")

    def finish(self, trial, metrics, stopped) -> None:
        if not stopped:
            self.scheduler.on_trial_complete(trial, self._result(self.problem.max_iterations, metrics))


class RayTunePeer:
    """Ray Tune's ASHA (``AsyncHyperBandScheduler``) with ``OptunaSearch``. The scheduler
    keys its state by ``trial.trial_id`` only, so a handle with that attribute stands in
    for Ray's ``Trial``; it draws its bracket with numpy's global RNG, seeded here."""

    def __init__(self, problem: Problem, algorithm: str, seed: int) -> None:
        import numpy as np
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
        from ray.tune.search.optuna import OptunaSearch

        np.random.seed(seed)
        mode = "min" if problem.minimize else "max"
        self.problem = problem
        self.scheduler = ASHAScheduler(time_attr="epoch", metric=problem.objective, mode=mode,
                                       max_t=problem.max_iterations, grace_period=problem.grace_period,
                                       reduction_factor=3)
        sampler = (optuna.samplers.TPESampler(seed=seed) if algorithm == "tpe"
                   else optuna.samplers.RandomSampler(seed=seed))
        self.search = OptunaSearch(space=OptunaSearch.convert_search_space(_tune_space(problem, tune)),
                                   metric=problem.objective, mode=mode,
                                   sampler=sampler)
        self.next_id = 0

    def ask(self):
        from types import SimpleNamespace

        trial = SimpleNamespace(trial_id=f"t{self.next_id}")
        self.next_id += 1
        config = self.search.suggest(trial.trial_id)
        if config is None:
            return None
        self.scheduler.on_trial_add(None, trial)
        return trial, config

    def _result(self, iteration: int, metrics: Mapping[str, float]) -> dict[str, Any]:
        return {self.problem.objective: metrics[self.problem.objective], "epoch": iteration,
                "training_iteration": iteration}

    def report(self, trial, iteration, metrics) -> bool:
        result = self._result(iteration, metrics)
        self.search.on_trial_result(trial.trial_id, result)
        return self.scheduler.on_trial_result(None, trial, result) == "CONTINUE"

    def finish(self, trial, metrics, stopped) -> None:
        result = self._result(self.problem.max_iterations, metrics)
        self.scheduler.on_trial_complete(None, trial, result)
        self.search.on_trial_complete(trial.trial_id, result)   # Ray Tune tells it stopped trials too


def _tune_space(problem: Problem, tune: Any) -> dict[str, Any]:
    space: dict[str, Any] = {}
    for name, dist in problem.space.items():
        (kind, args), = dist.items()
        space[name] = {"uniform": lambda a: tune.uniform(*a), "loguniform": lambda a: tune.loguniform(*a),
                       "randint": lambda a: tune.randint(a[0], a[1]),
                       "choice": lambda a: tune.choice(list(a))}["choice" if kind == "ordinal" else kind](args)
    return space


def ray_tune_available() -> bool:
    try:
        import ray.tune.search.optuna  # noqa: F401
    except Exception:   # not installed, or a dependency of it is not
        return False
    return True


def syne_tune_available() -> bool:
    try:
        import syne_tune.optimizer.baselines  # noqa: F401
    except Exception:   # not installed, or a dependency of it is not
        return False
    return True


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
