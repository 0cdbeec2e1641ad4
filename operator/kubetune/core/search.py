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
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from kubetune.core import optuna_compat
from kubetune.core.samplers import (WS_CMA_MIN_TRIALS, ask_seed, cma_source_trials, contains,  # noqa: F401
                                    from_study, make_sampler, missing_packages, reseed, resample,
                                    to_distribution, to_study)
from kubetune.core.search_values import (RUNG_ATTR_PREFIX, config_key, history_values, kept_steps, objective_value,
                                         record_latest)
from kubetune.core.types import TrialPhase, TrialRecord
from kubetune.core.warm_box import bounding_box
from kubetune.core.warm_trials import WarmTrial, usable_warm_trials
from kubetune.spec.model import ExperimentSpec, Param, SpecError


@dataclass(frozen=True)
class Evaluated:
    """A configuration with results: a trial of this Experiment or a warm-start trial."""
    source: str
    metrics: Mapping[str, float]


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
            self._grid = {name: [to_study(self.space, {name: v})[name] for v in self.space[name].grid_values()]
                          for name in sorted(self.space)}
        self.study = self._new_study()
        self._enqueue_initial_points()

    # ------------------------------------------------------------------ setup

    def _sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        return make_sampler(self._spec.search.algorithm, seed, grid=self._grid, grid_seed=self._spec.search.seed,
                            cma_source_trials=self._cma_source_trials)

    def _new_study(self) -> optuna.Study:
        """A study holding the warm-start trials first, so kubetune trial ``index`` is
        Optuna trial number ``offset + index``; then the initial points not yet asked."""
        seed = self._spec.search.seed
        directions = ["minimize" if o.mode == "min" else "maximize" for o in self._spec.objectives]
        study = optuna.create_study(study_name=self._study_name, directions=directions,
                                    sampler=self._sampler(seed), pruner=optuna.pruners.NopPruner())
        for warm, frozen in zip(self._warm, self._warm_frozen()):
            optuna_compat.add_trial(study, frozen)
            self._evaluated.setdefault(config_key(warm.params, self.distributions),
                                       Evaluated(warm.source, dict(warm.metrics)))
        self.offset = len(self._warm)
        return study

    def _cma_source_trials(self) -> list[optuna.trial.FrozenTrial] | None:
        return cma_source_trials(self._warm_frozen(), self.distributions)

    def _warm_frozen(self) -> list[optuna.trial.FrozenTrial]:
        """The warm-start trials as completed Optuna trials (what ``Study.add_trial`` adds)."""
        return [optuna.trial.create_trial(
            state=TrialState.COMPLETE, values=[warm.metrics[o.metric] for o in self._spec.objectives],
            params=to_study(self.space, warm.params), distributions=self.distributions,
            user_attrs={"kubetune:source": warm.source},
            system_attrs=self._constraint_attrs(warm.metrics)) for warm in self._warm]

    def _enqueue_initial_points(self) -> None:
        # Enqueued trials take their numbers now: call after every restored trial is added.
        for point in self._spec.search.initial_points[self._asked:]:
            self.study.enqueue_trial(to_study(self.space, point), skip_if_exists=False)

    def _compatible(self, warm_start: Sequence[WarmTrial]) -> tuple[list[WarmTrial], list[str]]:
        return usable_warm_trials(self._spec, self.distributions, warm_start)

    def _narrow_to_box(self) -> None:
        """Search only the box of the best warm-start trials (core/warm_box.py); the
        warm-start trials outside it cannot be represented in it and are left out."""
        box, why = bounding_box(self._spec, self._warm)
        if box is None:
            self.warm_start_region = why
            return
        self.space = box.space
        self.distributions = {name: to_distribution(p) for name, p in self.space.items()}
        inside = [w for w in self._warm if all(contains(self.space[name], dist, w.params[name])
                                               for name, dist in self.distributions.items())]
        outside = len(self._warm) - len(inside)
        self._warm = inside
        self.warm_start_region = box.description + (
            f"; {outside} earlier trials outside it do not seed the search" if outside else "")

    def _set_constraints(self, study: optuna.Study, trial_id: int, metrics: Mapping[str, Any]) -> None:
        """Optuna's per-trial constraint values (``Trial.set_constraint``'s keys, which
        replace the deprecated ``constraints_func``): <= 0 is feasible. Samplers (TPE,
        NSGA-II) and the Pareto front read them."""
        for key, violation in self._constraint_attrs(metrics).items():
            optuna_compat.storage(study).set_trial_system_attr(trial_id, key, violation)

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
            reseed(self.study.sampler, ask_seed(self._spec.search.seed, self._asked))
        trial = self.study.ask(self.distributions)
        self._asked += 1
        self._ids[trial_name] = optuna_compat.trial_id(trial)
        self._running[trial_name] = trial
        self._last_step[trial_name] = 0
        return from_study(self.space, {name: trial.params[name] for name in self.distributions})

    def report_intermediate(self, trial_name: str, iteration: int, value: float) -> None:
        """Record one objective value (as judged: NaN for any non-finite one). Iterations
        only grow, except that a retry repeats those after its checkpoint: as Optuna
        keeps the first value of a step, a step at or below the highest is ignored."""
        # Optuna keeps no intermediate values for several objectives (MO-ASHA keeps its own)
        if trial_name not in self._running or iteration <= self._last_step[trial_name] or self.multi_objective:
            return
        self._last_step[trial_name] = iteration
        storage, trial_id = optuna_compat.storage(self.study), self._ids[trial_name]
        storage.set_trial_intermediate_value(trial_id, iteration, value)
        # Optuna copies the whole dict on every report: kept bounded, a report costs the
        # same at result 30,000 as at result 1 (issue 14; was O(results^2) per trial).
        frozen = storage.get_trial(trial_id)
        values = frozen.intermediate_values
        keep = kept_steps(values, self._minimize, self.keep_step)
        if len(keep) < len(values):
            trimmed = copy.copy(frozen)
            trimmed.intermediate_values = {step: values[step] for step in sorted(keep)}
            optuna_compat.replace_trial(self.study, trial_id, trimmed)

    def trial_state(self, trial_name: str) -> dict[str, Any]:
        """What the study holds about a trial that a later decision can read, bounded:
        {"steps": [[step, value], ...], "attrs": {rung key: value}}; see ``rebuild``."""
        trial_id = self._ids.get(trial_name)
        if trial_id is None:
            return {}
        frozen = optuna_compat.storage(self.study).get_trial(trial_id)
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
            self._set_constraints(self.study, optuna_compat.trial_id(trial), metrics)
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
        return optuna_compat.storage(self.study).get_trial(optuna_compat.trial_id(trial))

    def trial_id(self, index: int) -> int:
        """Optuna's storage id of the trial with this index (== Optuna trial number)."""
        return optuna_compat.trial_id_of_number(self.study, self.offset + index)

    def index_of(self, trial: optuna.trial.FrozenTrial) -> int | None:
        """The kubetune index of one of this Experiment's Optuna trials; None for warm-start ones."""
        return trial.number - self.offset if trial.number >= self.offset else None

    def resample(self, name: str, rng: random.Random) -> Any:
        """A fresh value for one parameter, independent of the study (PBT's explore step)."""
        return resample(self.space[name], rng)

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
                optuna_compat.skip_qmc_point(self.study.sampler, self.study, self.distributions)
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
        return optuna_compat.add_trial(self.study, frozen)

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
                state=TrialState.RUNNING, params=to_study(self.space, record.params), distributions=self.distributions,
                intermediate_values=values, system_attrs=attrs)
        except ValueError:
            # Parameters outside today's search space (the spec changed while the operator
            # was down): the trial still takes its number, but cannot inform the sampler.
            return optuna.trial.create_trial(state=TrialState.FAIL)

