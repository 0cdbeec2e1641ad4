"""Where new parameters come from: an in-memory Optuna study driven by ask/tell.

The study is also the shared memory of the pruner-based schedulers (ASHA, HyperBand,
median read intermediate values from it), so every reported objective value goes
through ``report_intermediate``. It is never persisted: after an operator restart it
is rebuilt from the Trial resources with ``rebuild``.
"""
from __future__ import annotations

import importlib.util
import math
import random
import warnings
from typing import Any, Callable, Iterable, Mapping

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.spec.model import ExperimentSpec, Param, SpecError

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
        top = param.grid_values()[-1]
        if param.is_integer:
            return IntDistribution(param.low, top, step=param.q)
        return FloatDistribution(param.low, top, step=param.q)
    return CategoricalDistribution(param.choices)


def objective_value(metrics: Mapping[str, Any], metric: str) -> float | None:
    """The objective in one reported metrics dict, or None when absent or not a number."""
    value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def history_values(history: Iterable[Mapping[str, Any]], metric: str) -> dict[int, float]:
    """{iteration: objective} from a persisted history, keeping the first value per
    iteration as Optuna does when a retry reports an iteration again."""
    values: dict[int, float] = {}
    for position, metrics in enumerate(history, start=1):
        value = objective_value(metrics, metric)
        iteration = metrics.get("iteration", position)
        if value is not None and isinstance(iteration, int) and iteration not in values:
            values[iteration] = value
    return values


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler stops the study from ``after_trial`` once every point is done, which
    raises outside ``study.optimize``; with ask/tell the Searcher counts the grid itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def _derived_seed(seed: int | None, restored: int) -> int | None:
    # A sampler re-seeded with the original seed after a restart would replay the first
    # trials' parameters; mixing in the number of restored trials gives a fresh stream
    # that is still reproducible.
    if seed is None or restored == 0:
        return seed
    return (seed * 1_000_003 + restored) % 2**32


class Searcher:
    """Optuna ask/tell behind names: one Optuna trial per kubetune trial, number == index."""

    def __init__(self, spec: ExperimentSpec, *, study_name: str = "kubetune") -> None:
        algorithm = spec.search.algorithm
        missing = missing_packages(algorithm)
        if missing:
            raise SpecError("spec.search.algorithm",
                            f"{algorithm} needs the Python package(s) {', '.join(missing)}, which this "
                            f"operator does not have; use tpe or random, or install them in the operator image")
        # kubetune reports trial outcomes itself; Optuna's per-trial INFO lines would
        # duplicate every one of them in the operator log.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._spec = spec
        self._metric = spec.objective.metric
        self._study_name = study_name
        self.distributions = {name: to_distribution(p) for name, p in spec.search_space.items()}
        self._grid: dict[str, list[Any]] | None = None
        if algorithm == "grid":
            # GridSampler sorts names itself; build the same dict so restored trials carry
            # the exact ``search_space`` attribute it compares against.
            self._grid = {name: spec.search_space[name].grid_values() for name in sorted(spec.search_space)}
        self._rng = random.Random(spec.search.seed)
        self._running: dict[str, optuna.trial.Trial] = {}
        self._reported: dict[str, set[int]] = {}
        self._asked = 0
        self.study = self._new_study(restored=0)

    # ------------------------------------------------------------------ setup

    def _sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        algorithm = self._spec.search.algorithm
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if algorithm == "grid":
                return _AskTellGridSampler(self._grid, seed=self._spec.search.seed)
            if algorithm == "tpe":
                # constant_liar: running trials count as bad results, so parallel asks
                # do not all land on the same promising point.
                return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
            if algorithm == "cmaes":
                return optuna.samplers.CmaEsSampler(seed=seed, consider_pruned_trials=True,
                                                    warn_independent_sampling=False)
            if algorithm == "gp":
                return optuna.samplers.GPSampler(seed=seed)
            if algorithm == "qmc":
                # Scrambled, so a restart (new derived seed) continues with fresh points.
                return optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False)
            return optuna.samplers.RandomSampler(seed=seed)

    def _new_study(self, restored: int) -> optuna.Study:
        seed = _derived_seed(self._spec.search.seed, restored)
        direction = "minimize" if self._spec.objective.mode == "min" else "maximize"
        return optuna.create_study(study_name=self._study_name, direction=direction,
                                   sampler=self._sampler(seed), pruner=optuna.pruners.NopPruner())

    # ------------------------------------------------------------------ ask / tell

    @property
    def grid_size(self) -> int | None:
        if self._grid is None:
            return None
        return math.prod(len(values) for values in self._grid.values())

    @property
    def exhausted(self) -> bool:
        """No new parameters can come: every grid point has been handed out."""
        return self.grid_size is not None and self._asked >= self.grid_size

    def suggest(self, trial_name: str) -> dict[str, Any] | None:
        """Parameters for a new trial, or None when the search space is exhausted."""
        if self.exhausted:
            return None
        trial = self.study.ask(self.distributions)
        self._asked += 1
        self._running[trial_name] = trial
        self._reported[trial_name] = set()
        return {name: trial.params[name] for name in self.distributions}

    def report_intermediate(self, trial_name: str, iteration: int, value: float) -> None:
        """Record one objective value; a repeated iteration (after a retry) keeps the first."""
        trial = self._running.get(trial_name)
        reported = self._reported.get(trial_name)
        if trial is None or iteration in reported:
            return
        reported.add(iteration)
        trial.report(value, iteration)

    def complete(self, trial_name: str, value: float | None, phase: TrialPhase) -> None:
        """Finish the Optuna trial: Succeeded -> COMPLETE with ``value`` (the last reported
        objective), Stopped -> PRUNED (its intermediate values still inform TPE), Failed -> FAIL."""
        trial = self._running.pop(trial_name, None)
        self._reported.pop(trial_name, None)
        if trial is None:
            return
        if phase is TrialPhase.SUCCEEDED and value is not None and not math.isnan(value):
            self.study.tell(trial, value)
        elif phase in (TrialPhase.SUCCEEDED, TrialPhase.STOPPED):
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def frozen_trial(self, trial_name: str) -> optuna.trial.FrozenTrial | None:
        """The stored trial as a pruner sees it; None once the trial is finished."""
        trial = self._running.get(trial_name)
        if trial is None:
            return None
        # Pruners take the FrozenTrial from storage, as Optuna's own Trial.should_prune does;
        # study.get_trials() would copy every trial to find one.
        return self.study._storage.get_trial(trial._trial_id)

    def trial_id(self, index: int) -> int:
        """Optuna's storage id of the trial with this index (== Optuna trial number)."""
        return self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, index)

    def resample(self, name: str) -> Any:
        """A fresh value for one parameter, independent of the study (PBT's explore step)."""
        param = self._spec.search_space[name]
        rng = self._rng
        if param.kind == "uniform":
            return rng.uniform(param.low, param.high)
        if param.kind == "loguniform":
            return math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
        if param.kind in ("quniform", "randint"):
            return rng.choice(param.grid_values())
        return rng.choice(param.choices)

    # ------------------------------------------------------------------ restore

    def rebuild(self, records: Iterable[TrialRecord], replay: Callable[[], None] | None = None) -> None:
        """Replace the study with one holding every persisted trial, so sampling continues
        where the previous operator stopped. Trials not yet finished stay RUNNING (TPE's
        constant liar treats them as pending); index gaps become failed placeholders so
        Optuna's trial numbers keep matching kubetune's indices.

        ``replay`` runs while every restored trial is still RUNNING (Optuna refuses to
        change finished trials), so a pruner can re-record its per-trial state; then the
        finished ones are told their final state.
        """
        ordered = sorted(records, key=lambda r: r.index)
        self.study = self._new_study(restored=len(ordered))
        self._running.clear()
        self._reported.clear()
        finals: list[tuple[int, TrialState, float | None]] = []
        number = 0
        for record in ordered:
            while number < record.index:
                self._add(optuna.trial.create_trial(state=TrialState.FAIL))
                number += 1
            frozen = self._frozen_from_record(record)
            if frozen.state is TrialState.FAIL and not frozen.params:
                self._add(frozen)          # unusable parameters: nothing to replay or resume
            else:
                state, value = self._final_state(record)
                trial_id = self._add(frozen)
                if state is TrialState.RUNNING:
                    self._running[record.name] = optuna.trial.Trial(self.study, trial_id)
                    self._reported[record.name] = set(frozen.intermediate_values)
                else:
                    finals.append((number, state, value))
            number += 1
        self._asked = number
        if replay is not None:
            replay()
        for trial_number, state, value in finals:
            if state is TrialState.COMPLETE:
                self.study.tell(trial_number, value)
            else:
                self.study.tell(trial_number, state=state)

    def _add(self, frozen: optuna.trial.FrozenTrial) -> int:
        # Study.add_trial returns nothing; the trial id is needed to keep reporting to it.
        return self.study._storage.create_new_trial(self.study._study_id, template_trial=frozen)

    def _final_state(self, record: TrialRecord) -> tuple[TrialState, float | None]:
        last = objective_value(record.history[-1], self._metric) if record.history else None
        if not record.phase.is_terminal:
            return TrialState.RUNNING, None
        if record.phase is TrialPhase.SUCCEEDED and last is not None and not math.isnan(last):
            return TrialState.COMPLETE, last
        if record.phase is TrialPhase.FAILED or not record.history:
            return TrialState.FAIL, None
        return TrialState.PRUNED, None

    def _frozen_from_record(self, record: TrialRecord) -> optuna.trial.FrozenTrial:
        """The trial as RUNNING, with its parameters and intermediate values."""
        attrs = {}
        if self._grid is not None and record.index < (self.grid_size or 0):
            attrs = {"search_space": self._grid, "grid_id": record.index}
        try:
            return optuna.trial.create_trial(
                state=TrialState.RUNNING, params=dict(record.params), distributions=self.distributions,
                intermediate_values=history_values(record.history, self._metric), system_attrs=attrs)
        except ValueError:
            # Parameters outside today's search space (the spec changed while the operator
            # was down): the trial still takes its number, but cannot inform the sampler.
            return optuna.trial.create_trial(state=TrialState.FAIL)
