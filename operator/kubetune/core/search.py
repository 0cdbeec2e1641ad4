"""Where new parameters come from: an in-memory Optuna study driven by ask/tell.

The study is also the shared memory of the pruner-based schedulers (ASHA, HyperBand,
median read intermediate values from it), so every reported objective value goes
through ``report_intermediate``. It is never persisted: after an operator restart it
is rebuilt from the Trial resources with ``rebuild``.

Bounded and exactly restorable: a trial's intermediate values in the study are only
those a decision can read (``kept_steps``): the last step (samplers rank a pruned
trial by it), the best step (the median rule compares a trial's best so far), and
the steps the scheduler judges at (``Searcher.keep_step``: the median rule's
milestones, where completed trials are compared).  Successive halving keeps its rung
values as system attributes.  ``trial_state`` is that bounded record, written on the
Trial's status (``status.decisionState``); ``rebuild`` puts exactly it back, so a
restarted operator holds the same study and decides the same, without any history.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import random
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import optuna
from optuna.samplers._lazy_random_state import LazyRandomState
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.core.values import judged
from kubetune.core.warm_box import bounding_box
from kubetune.spec.model import ALGORITHMS, DISTRIBUTIONS, ExperimentSpec, Param, SpecError

# Samplers whose Optuna implementation imports packages kubetune does not depend on.
OPTIONAL_PACKAGES = {"cmaes": ("cmaes",), "gp": ("torch", "scipy"), "qmc": ("scipy",)}


# warm-starting CMA-ES needs this many earlier trials (it starts from their best 10%)
WS_CMA_MIN_TRIALS = 10


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
    raise ValueError(f"unknown distribution {param.kind!r}; known: {', '.join(DISTRIBUTIONS)}")


def objective_value(metrics: Mapping[str, Any], metric: str) -> float | None:
    """The objective in one reported metrics dict, or None when absent or not a number."""
    value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def history_values(history: Iterable[Mapping[str, Any]], metric: str) -> dict[int, float]:
    """{iteration: objective as judged} from a history of results (a Trial written by an
    operator that kept full histories), keeping the first value per iteration as Optuna
    does when a retry reports an iteration again."""
    values: dict[int, float] = {}
    for position, metrics in enumerate(history, start=1):
        value = objective_value(metrics, metric)
        iteration = metrics.get("iteration", position)
        if value is not None and isinstance(iteration, int) and iteration not in values:
            values[iteration] = judged(value)
    return values


# The system attributes a pruner decides on (SuccessiveHalvingPruner's rung values).
RUNG_ATTR_PREFIX = "completed_rung_"


def kept_steps(values: Mapping[int, float], minimize: bool, keep_step: Callable[[int], bool] | None) -> set[int]:
    """The steps of ``values`` a decision can read (see the module docstring)."""
    if not values:
        return set()
    keep = {max(values)}
    finite = [(v, s) for s, v in values.items() if not math.isnan(v)]
    if finite:
        keep.add((min(finite) if minimize else max(finite, key=lambda p: (p[0], -p[1])))[1])
    if keep_step is not None:
        keep.update(s for s in values if keep_step(s))
    return keep


def latest_values(history: Iterable[Mapping[str, Any]], metrics: Iterable[str]) -> dict[str, float]:
    """The last number reported for each metric (a trial may report some metrics once)."""
    latest: dict[str, float] = {}
    wanted = set(metrics)
    for entry in reversed(list(history)):
        for name in wanted - latest.keys():
            value = objective_value(entry, name)
            if value is not None:
                latest[name] = value
        if len(latest) == len(wanted):
            break
    return latest


def record_latest(record: TrialRecord, metrics: Iterable[str]) -> dict[str, float]:
    """A persisted trial's latest values: from its history, and from ``latest_metrics``,
    which holds them whole when the history is downsampled."""
    wanted = list(metrics)
    latest = latest_values(record.history, wanted)
    latest.update({k: v for k, v in (record.latest_metrics or {}).items() if k in wanted})
    return latest


@dataclass(frozen=True)
class WarmTrial:
    """A completed trial of an earlier Experiment: ``source`` is ``<experiment>/<trial>``."""
    source: str
    params: Mapping[str, Any]
    metrics: Mapping[str, Any]


def warm_trials(experiment: str, records: Iterable[TrialRecord]) -> list[WarmTrial]:
    """The trials of an earlier Experiment that can seed a search: those that succeeded,
    with the latest value of every metric they reported."""
    found = []
    for record in sorted(records, key=lambda r: r.index):
        if record.phase is not TrialPhase.SUCCEEDED:
            continue
        metrics: dict[str, Any] = {}
        for entry in record.history:
            metrics.update({k: v for k, v in entry.items() if k != "iteration" and objective_value(entry, k) is not None})
        metrics.update(record.latest_metrics or {})
        found.append(WarmTrial(f"{experiment}/{record.name}", dict(record.params), metrics))
    return found


@dataclass(frozen=True)
class Evaluated:
    """A configuration with results: a trial of this Experiment or a warm-start trial."""
    source: str
    metrics: Mapping[str, float]


def config_key(params: Mapping[str, Any], names: Iterable[str]) -> tuple:
    """Equal for equal configurations; repr keeps 1 and 1.0 and True apart, as the space does."""
    return tuple((name, type(params.get(name)).__name__, repr(params.get(name))) for name in sorted(names))


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler stops the study from ``after_trial`` once every point is done, which
    raises outside ``study.optimize``; with ask/tell the Searcher counts the grid itself."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def _ask_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) % 2**32


def _reseed(sampler: optuna.samplers.BaseSampler, seed: int) -> None:
    """Seed every random state of ``sampler`` (and of the samplers it holds, such as
    TPE's startup sampler).  Done before each ask with a seed from (spec seed, trial
    index): the parameters of trial n depend only on the seed and the study, which
    ``rebuild`` restores exactly, so a restarted operator suggests what it would have
    without the restart (and never replays the first trials' parameters)."""
    for value in vars(sampler).values():
        if isinstance(value, LazyRandomState):
            value.rng.seed(seed)
        elif isinstance(value, optuna.samplers.BaseSampler):
            _reseed(value, seed)


class Searcher:
    """Optuna ask/tell behind names: one Optuna trial per kubetune trial, number == index."""

    def __init__(self, spec: ExperimentSpec, *, study_name: str = "kubetune",
                 warm_start: Sequence[WarmTrial] = ()) -> None:
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
        # what is searched: the spec's space, or the warm-start bounding box (_narrow_to_box)
        self.space: dict[str, Param] = dict(spec.search_space)
        self.distributions = {name: to_distribution(p) for name, p in self.space.items()}
        self._minimize = spec.objective.mode == "min"
        self.keep_step: Callable[[int], bool] | None = None     # set by a scheduler (median)
        self._ids: dict[str, int] = {}          # trial name -> storage id, finished ones too
        self._running: dict[str, optuna.trial.Trial] = {}
        self._last_step: dict[str, int] = {}    # highest step recorded per running trial
        # trials rebuilt from their bounded state (rung values included): no replay
        self.restored_bounded: set[str] = set()
        self._asked = 0
        self.multi_objective = spec.multi_objective
        # every metric a trial's outcome depends on: objectives, then constraint metrics
        self.tracked_metrics = tuple(dict.fromkeys([o.metric for o in spec.objectives] +
                                                   [c.metric for c in spec.constraints]))
        # configuration -> its results, so an evaluated one is never run again
        self._evaluated: dict[tuple, Evaluated] = {}
        self._warm, self.warm_start_problems = self._compatible(warm_start)
        self.warm_start_region = ""     # the bounding box searched, in words (WarmStarted condition)
        if spec.warm_start is not None and spec.warm_start.search_space == "boundingBox":
            self._narrow_to_box()
        self.warm_start_used = len(self._warm)
        self._grid: dict[str, list[Any]] | None = None
        if algorithm == "grid":
            # GridSampler sorts names itself; build the same dict so restored trials carry
            # the exact ``search_space`` attribute it compares against.
            self._grid = {name: self.space[name].grid_values() for name in sorted(self.space)}
        self.study = self._new_study()
        self._enqueue_initial_points()

    # ------------------------------------------------------------------ setup

    def _sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        algorithm = self._spec.search.algorithm
        samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
            "random": lambda: optuna.samplers.RandomSampler(seed=seed),
            "grid": lambda: _AskTellGridSampler(self._grid, seed=self._spec.search.seed),
            # constant_liar: running trials count as bad results, so parallel asks
            # do not all land on the same promising point.
            "tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True),
            "nsgaii": lambda: optuna.samplers.NSGAIISampler(seed=seed),
            # warm start: CMA-ES starts from the earlier trials' promising region (Optuna's
            # warm-starting CMA-ES, Nomura et al. AAAI 2021); the study's trials alone do not
            # move it (it reads only the trials of its own generations)
            "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, consider_pruned_trials=True,
                                                          warn_independent_sampling=False,
                                                          source_trials=self._cma_source_trials()),
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

    def _new_study(self) -> optuna.Study:
        """A study holding the warm-start trials first, so kubetune trial ``index`` is
        Optuna trial number ``offset + index``; then the initial points not yet asked."""
        seed = self._spec.search.seed
        directions = ["minimize" if o.mode == "min" else "maximize" for o in self._spec.objectives]
        study = optuna.create_study(study_name=self._study_name, directions=directions,
                                    sampler=self._sampler(seed), pruner=optuna.pruners.NopPruner())
        for warm, frozen in zip(self._warm, self._warm_frozen()):
            study._storage.create_new_trial(study._study_id, template_trial=frozen)
            self._evaluated.setdefault(config_key(warm.params, self.distributions),
                                       Evaluated(warm.source, dict(warm.metrics)))
        self.offset = len(self._warm)
        return study

    def _cma_source_trials(self) -> list[optuna.trial.FrozenTrial] | None:
        # WS-CMA-ES fits its start to the best 10% of the earlier trials (cmaes'
        # get_warm_start_mgd, gamma 0.1): fewer than 10 select none, and it refuses
        trials = self._warm_frozen()
        if len(trials) < WS_CMA_MIN_TRIALS:
            return None
        # CMA-ES searches only the numeric parameters with more than one value (a choice,
        # or a range a bounding box narrowed to one value, is sampled on its own), and
        # accepts a source trial only if its parameters are exactly those: otherwise it
        # raises "No compatible source_trials" on every ask.
        cma_space = {name: d for name, d in self.distributions.items()
                     if isinstance(d, (FloatDistribution, IntDistribution)) and not d.single()}
        if not cma_space:
            return None
        return [optuna.trial.create_trial(
            state=t.state, values=t.values, params={n: t.params[n] for n in cma_space},
            distributions=cma_space, user_attrs=t.user_attrs, system_attrs=t.system_attrs) for t in trials]

    def _warm_frozen(self) -> list[optuna.trial.FrozenTrial]:
        """The warm-start trials as completed Optuna trials (what ``Study.add_trial`` adds)."""
        return [optuna.trial.create_trial(
            state=TrialState.COMPLETE, values=[warm.metrics[o.metric] for o in self._spec.objectives],
            params=dict(warm.params), distributions=self.distributions, user_attrs={"kubetune:source": warm.source},
            system_attrs=self._constraint_attrs(warm.metrics)) for warm in self._warm]

    def _enqueue_initial_points(self) -> None:
        # Enqueued trials take their numbers now: call after every restored trial is added.
        for point in self._spec.search.initial_points[self._asked:]:
            self.study.enqueue_trial(dict(point), skip_if_exists=False)

    def _compatible(self, warm_start: Sequence[WarmTrial]) -> tuple[list[WarmTrial], list[str]]:
        """The warm-start trials this search space can use (their values for today's
        parameters, extra parameters dropped), and why the others cannot be used."""
        usable: list[WarmTrial] = []
        problems: list[str] = []
        for warm in warm_start:
            missing = [name for name in self.distributions if name not in warm.params]
            outside = [name for name, dist in self.distributions.items()
                       if name in warm.params and not _contains(dist, warm.params[name])]
            unreported = [o.metric for o in self._spec.objectives
                          if objective_value(warm.metrics, o.metric) is None
                          or math.isnan(objective_value(warm.metrics, o.metric))]
            if missing:
                problems.append(f"{warm.source}: has no value for {', '.join(missing)}")
            elif outside:
                problems.append(f"{warm.source}: {', '.join(f'{n}={warm.params[n]!r}' for n in outside)} "
                                f"outside this search space")
            elif unreported:
                problems.append(f"{warm.source}: reported no {', '.join(unreported)}")
            else:
                if self._spec.warm_start is not None and len(usable) >= self._spec.warm_start.max_trials:
                    problems.append(f"{warm.source} and later: beyond warmStart.maxTrials "
                                    f"({self._spec.warm_start.max_trials})")
                    break
                usable.append(WarmTrial(warm.source, {n: warm.params[n] for n in self.distributions},
                                        {k: v for k, v in warm.metrics.items() if objective_value(warm.metrics, k)
                                         is not None}))
        return usable, problems

    def _narrow_to_box(self) -> None:
        """Search only the box of the best warm-start trials (core/warm_box.py); the
        warm-start trials outside it cannot be represented in it and are left out."""
        box, why = bounding_box(self._spec, self._warm)
        if box is None:
            self.warm_start_region = why
            return
        self.space = box.space
        self.distributions = {name: to_distribution(p) for name, p in self.space.items()}
        inside = [w for w in self._warm
                  if all(_contains(dist, w.params[name]) for name, dist in self.distributions.items())]
        outside = len(self._warm) - len(inside)
        self._warm = inside
        self.warm_start_region = box.description + (
            f"; {outside} earlier trials outside it do not seed the search" if outside else "")

    def _set_constraints(self, study: optuna.Study, trial_id: int, metrics: Mapping[str, Any]) -> None:
        """Optuna's per-trial constraint values (``Trial.set_constraint``'s keys, which
        replace the deprecated ``constraints_func``): <= 0 is feasible. Samplers (TPE,
        NSGA-II) and the Pareto front read them."""
        for key, violation in self._constraint_attrs(metrics).items():
            study._storage.set_trial_system_attr(trial_id, key, violation)

    def _constraint_attrs(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        return {f"constraints:{c.metric}": c.violation(objective_value(metrics, c.metric))
                for c in self._spec.constraints}

    def evaluated(self, params: Mapping[str, Any]) -> Evaluated | None:
        """The results of an earlier evaluation of exactly these parameters, if any."""
        return self._evaluated.get(config_key(params, self.distributions))

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
        if self._spec.search.seed is not None:
            _reseed(self.study.sampler, _ask_seed(self._spec.search.seed, self._asked))
        trial = self.study.ask(self.distributions)
        self._asked += 1
        self._ids[trial_name] = trial._trial_id
        self._running[trial_name] = trial
        self._last_step[trial_name] = 0
        return {name: trial.params[name] for name in self.distributions}

    def report_intermediate(self, trial_name: str, iteration: int, value: float) -> None:
        """Record one objective value (as judged: NaN for any non-finite one). Iterations
        only grow, except that a retry repeats those after its checkpoint: as Optuna
        keeps the first value of a step, a step at or below the highest is ignored."""
        # Optuna keeps no intermediate values for several objectives (MO-ASHA keeps its own)
        if trial_name not in self._running or iteration <= self._last_step[trial_name] or self.multi_objective:
            return
        self._last_step[trial_name] = iteration
        storage, trial_id = self.study._storage, self._ids[trial_name]
        storage.set_trial_intermediate_value(trial_id, iteration, value)
        # Optuna copies the whole dict on every report: kept bounded, a report costs the
        # same at result 30,000 as at result 1 (issue 14; was O(results^2) per trial).
        frozen = storage.get_trial(trial_id)
        values = frozen.intermediate_values
        keep = kept_steps(values, self._minimize, self.keep_step)
        if len(keep) < len(values):
            trimmed = copy.copy(frozen)
            trimmed.intermediate_values = {step: values[step] for step in sorted(keep)}
            storage._set_trial(trial_id, trimmed)

    def trial_state(self, trial_name: str) -> dict[str, Any]:
        """What the study holds about a trial that a later decision can read, bounded:
        {"steps": [[step, value], ...], "attrs": {rung key: value}}; see ``rebuild``."""
        trial_id = self._ids.get(trial_name)
        if trial_id is None:
            return {}
        frozen = self.study._storage.get_trial(trial_id)
        state: dict[str, Any] = {"steps": [[step, value] for step, value in sorted(frozen.intermediate_values.items())]}
        attrs = {k: v for k, v in frozen.system_attrs.items() if k.startswith(RUNG_ATTR_PREFIX)}
        if attrs:
            state["attrs"] = attrs
        return state

    def objective_values(self, value: float | None, metrics: Mapping[str, Any]) -> list[float] | None:
        """The values Optuna is told: the last objective for one objective, the latest of
        each objective for several; None when one is missing or not finite (the worst:
        the trial is told PRUNED, core/values.py)."""
        if self.multi_objective:
            values = [objective_value(metrics, o.metric) for o in self._spec.objectives]
        else:
            values = [value]
        if any(v is None or not math.isfinite(v) for v in values):
            return None
        return values

    def complete(self, trial_name: str, value: float | None, phase: TrialPhase,
                 metrics: Mapping[str, Any] | None = None, params: Mapping[str, Any] | None = None) -> None:
        """Finish the Optuna trial: Succeeded -> COMPLETE with ``value`` (the last reported
        objective; with several objectives, the latest of each in ``metrics``), Stopped ->
        PRUNED (its intermediate values still inform TPE), Failed -> FAIL. ``metrics`` also
        carries the constraint metrics; a completed ``params`` is remembered as evaluated."""
        trial = self._running.pop(trial_name, None)
        self._last_step.pop(trial_name, None)
        if trial is None:
            return
        metrics = metrics if metrics is not None else {}
        values = self.objective_values(value, metrics)
        if phase in (TrialPhase.SUCCEEDED, TrialPhase.STOPPED):
            self._set_constraints(self.study, trial._trial_id, metrics)
        if phase is TrialPhase.SUCCEEDED and values is not None:
            self.study.tell(trial, values)
            if params is not None:
                self._evaluated.setdefault(config_key(params, self.distributions), Evaluated(trial_name, dict(metrics)))
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
        return self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, self.offset + index)

    def index_of(self, trial: optuna.trial.FrozenTrial) -> int | None:
        """The kubetune index of one of this Experiment's Optuna trials; None for warm-start ones."""
        return trial.number - self.offset if trial.number >= self.offset else None

    def resample(self, name: str, rng: random.Random) -> Any:
        """A fresh value for one parameter, independent of the study (PBT's explore step)."""
        param = self.space[name]
        if param.kind == "uniform":
            return rng.uniform(param.low, param.high)
        if param.kind == "loguniform":
            return math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
        if param.kind in ("quniform", "randint"):
            # the same draw as rng.choice(grid_values()), without building the grid
            return param.grid_value(rng.randrange(param.grid_size()))
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
        self._evaluated.clear()
        self.study = self._new_study()
        self._running.clear()
        self._last_step.clear()
        self._ids.clear()
        self.restored_bounded = {r.name for r in ordered if (r.decision_state or {}).get("study") is not None}
        finals: list[tuple[TrialRecord, int, TrialState, list[float] | None]] = []
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
                self._ids[record.name] = trial_id
                if state is TrialState.RUNNING:
                    self._running[record.name] = optuna.trial.Trial(self.study, trial_id)
                    # the highest step the study saw (a step missing from the bounded
                    # record was followed by a higher one, so it is never asked again)
                    self._last_step[record.name] = max(frozen.intermediate_values, default=0)
                else:
                    finals.append((record, trial_id, state, value))
            number += 1
        self._asked = number
        if isinstance(self.study.sampler, optuna.samplers.QMCSampler):
            # QMC numbers its points in a study attribute; the points used before are at
            # most one per restored trial: skip that many (no repeats; the one sampler
            # whose sequence after a restart may differ from the one without, with CMA-ES
            # whose optimizer state Optuna keeps in attributes of the trials)
            for _ in range(number):
                self.study.sampler._find_sample_id(self.study, self.distributions)
        self._enqueue_initial_points()
        if replay is not None:
            replay()
        for record, trial_id, state, values in finals:
            metrics = record_latest(record, self.tracked_metrics)
            if state in (TrialState.COMPLETE, TrialState.PRUNED):
                self._set_constraints(self.study, trial_id, metrics)
            if state is TrialState.COMPLETE:
                self.study.tell(self.offset + record.index, values)
                self._evaluated.setdefault(config_key(record.params, self.distributions),
                                           Evaluated(record.name, metrics))
            else:
                self.study.tell(self.offset + record.index, state=state)

    def _add(self, frozen: optuna.trial.FrozenTrial) -> int:
        # Study.add_trial returns nothing; the trial id is needed to keep reporting to it.
        return self.study._storage.create_new_trial(self.study._study_id, template_trial=frozen)

    def _final_state(self, record: TrialRecord) -> tuple[TrialState, list[float] | None]:
        last = record.last_value
        if last is None and record.history:
            last = objective_value(record.history[-1], self._metric)
        values = self.objective_values(last, record_latest(record, self.tracked_metrics))
        if not record.phase.is_terminal:
            return TrialState.RUNNING, None
        if record.phase is TrialPhase.SUCCEEDED and values is not None:
            return TrialState.COMPLETE, values
        if record.phase is TrialPhase.FAILED or (last is None and not record.history):
            return TrialState.FAIL, None
        return TrialState.PRUNED, None

    def _frozen_from_record(self, record: TrialRecord) -> optuna.trial.FrozenTrial:
        """The trial as RUNNING, with its parameters and intermediate values."""
        attrs = {}
        if self._grid is not None and record.index < (self.grid_size or 0):
            attrs = {"search_space": self._grid, "grid_id": record.index}
        state = record.decision_state.get("study") if record.decision_state else None
        if self.multi_objective:
            values = {}
        elif state is not None:   # the bounded record trial_state wrote: exactly what the study held
            values = {int(step): float(value) for step, value in state.get("steps") or ()}
            attrs.update({k: float(v) for k, v in (state.get("attrs") or {}).items()})
        else:   # a Trial from before the bounded state: its history, replayed by the scheduler
            values = history_values(record.history, self._metric)
        try:
            return optuna.trial.create_trial(
                state=TrialState.RUNNING, params=dict(record.params), distributions=self.distributions,
                intermediate_values=values, system_attrs=attrs)
        except ValueError:
            # Parameters outside today's search space (the spec changed while the operator
            # was down): the trial still takes its number, but cannot inform the sampler.
            return optuna.trial.create_trial(state=TrialState.FAIL)


def _contains(distribution: BaseDistribution, value: Any) -> bool:
    try:
        return distribution._contains(distribution.to_internal_repr(value))
    except (ValueError, TypeError):
        return False
