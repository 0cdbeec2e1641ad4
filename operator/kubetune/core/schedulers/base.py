"""The ``TrialScheduler`` interface (Ray Tune's hooks) and the Optuna-pruner adapter.

A scheduler sees every objective value a trial reports and answers CONTINUE, PAUSE or
STOP with a reason a user can read on the Trial. It also picks which runnable trial
starts next. The runner owns phases, resources and budgets; a scheduler only judges.
"""
from __future__ import annotations

import copy
import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import optuna

from kubetune.core import optuna_compat
from kubetune.core.schedulers.rungs import Planned, Rung
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo
from kubetune.spec.model import ExperimentSpec


class Action(str, enum.Enum):
    CONTINUE = "continue"
    PAUSE = "pause"
    STOP = "stop"


@dataclass(frozen=True)
class SchedulerDecision:
    """``reason`` is a CamelCase word (EarlyStopped, Exploit); ``message`` the detail.
    A PAUSE with ``clone_from`` is a PBT exploit: restart from that trial's checkpoint
    with ``new_params``."""
    action: Action
    reason: str = ""
    message: str = ""
    clone_from: str | None = None
    new_params: Mapping[str, Any] | None = None


CONTINUE = SchedulerDecision(Action.CONTINUE)


class TrialScheduler:
    """FIFO behaviour: never stops anything early; runs trials in creation order,
    trials that already ran (retries, resumes) first.

    A subclass that sets ``name`` in its own body is a scheduler an Experiment can name
    (``spec.scheduler.type``): the package finds it by that (core/schedulers/__init__.py),
    no list to add it to."""

    name: ClassVar[str] = ""                       # spec.scheduler.type; "": not one to name
    objectives: ClassVar[tuple[str, ...]] = ("single",)   # "single" and/or "multi"
    requires_max_iterations: ClassVar[bool] = False  # spec.scheduler.maxIterations must be set
    # what `kubetune plan` says when this scheduler stops trials in a way it cannot count ahead
    plan_note: ClassVar[str] = ""

    @classmethod
    def planned(cls, spec: ExperimentSpec, study_name: str) -> Planned:
        """What the trials are expected to run (``kubetune plan``, core/plan.py): here every
        trial runs spec.scheduler.maxIterations (required by core/plan.py)."""
        trials, top = spec.budget.max_trials, spec.scheduler.max_iterations
        worst = float(trials * top)
        return Planned(worst, worst, (Rung(top, float(trials), trials),), (cls.plan_note,) if cls.plan_note else ())

    def at_rung(self, iteration: int) -> bool:
        """Whether ``iteration`` is where this scheduler judges (a promotion would start):
        a trial under ``budget.onExhausted: finishRung`` stops there.  None here: it runs on
        to maxIterations."""
        return False

    def __init__(self, spec: ExperimentSpec, searcher: Searcher) -> None:
        self.spec = spec
        self.searcher = searcher
        self.metric = spec.objective.metric

    def on_trial_add(self, trial: TrialInfo) -> None:
        pass

    def on_trial_result(self, trial: TrialInfo, value: float) -> SchedulerDecision:
        """``value`` is the objective in the result just recorded at ``trial.iteration``."""
        return CONTINUE

    def on_trial_complete(self, trial: TrialInfo) -> None:
        pass

    def on_trial_error(self, trial: TrialInfo) -> None:
        pass

    def on_trial_remove(self, trial: TrialInfo) -> None:
        pass

    def warning(self) -> str:
        """What keeps this scheduler from doing its work ("" if nothing): shown as a
        Warning Event and the Experiment's SchedulerWarning condition."""
        return ""

    def choose_trial_to_run(self, candidates: Sequence[TrialInfo]) -> TrialInfo | None:
        if not candidates:
            return None
        # A trial that already ran holds progress (and often a checkpoint): finish it first.
        return min(candidates, key=lambda t: (not t.resuming, t.index))

    def trial_state(self, trial: TrialInfo) -> dict[str, Any]:
        """What this scheduler keeps about a trial beyond the study, bounded; persisted
        on the Trial and handed back to ``restore``."""
        return {}

    def restore(self, trials: Iterable[TrialInfo], states: Mapping[str, Mapping[str, Any]]) -> None:
        """Rebuild internal state after ``Searcher.rebuild`` from the persisted trials and
        the ``trial_state`` each had."""


class PrunerScheduler(TrialScheduler):
    """Wraps an Optuna pruner that reads the searcher's study: the pruner decides, the
    subclass explains the decision from the same data the pruner used."""

    def __init__(self, spec: ExperimentSpec, searcher: Searcher, pruner: optuna.pruners.BasePruner) -> None:
        super().__init__(spec, searcher)
        self.pruner = pruner

    def on_trial_result(self, trial: TrialInfo, value: float) -> SchedulerDecision:
        frozen = self.searcher.frozen_trial(trial.name)
        if frozen is None or frozen.last_step is None:
            return CONTINUE
        pruned = self.prune(frozen)
        if not pruned:
            return CONTINUE
        return SchedulerDecision(Action.STOP, "EarlyStopped", self.explain(trial, frozen))

    def prune(self, frozen: optuna.trial.FrozenTrial) -> bool:
        """Ask the pruner about the trial's latest step (also used to replay on restore)."""
        return self.pruner.prune(self.searcher.study, frozen)

    def explain(self, trial: TrialInfo, frozen: optuna.trial.FrozenTrial) -> str:
        raise NotImplementedError

    # Pruners that keep state in the study (successive halving records each trial's
    # value at every rung it completed) find it in the study rebuilt from each Trial's
    # bounded state (Searcher.trial_state, with the rung values).  A Trial written before
    # that state existed gets it back by replaying its intermediate values, one step at
    # a time, in the order the trial reported them.
    replays_history = False

    def restore(self, trials: Iterable[TrialInfo], states: Mapping[str, Mapping[str, Any]]) -> None:
        if not self.replays_history:
            return
        study = self.searcher.study
        storage = optuna_compat.storage(study)
        for trial in sorted(trials, key=lambda t: t.index):
            if trial.name in self.searcher.restored_bounded:
                continue
            trial_id = self.searcher.trial_id(trial.index)
            steps = sorted(storage.get_trial(trial_id).intermediate_values.items())
            prefix: dict[int, float] = {}
            previous = None
            for step, value in steps:
                prefix[step] = value
                if self.replay_step(previous, step):
                    seen = copy.copy(storage.get_trial(trial_id))
                    seen.intermediate_values = dict(prefix)
                    self.prune(seen)
                previous = step

    def replay_step(self, previous: int | None, step: int) -> bool:
        """Whether replaying ``step`` (reported after ``previous``) can change the pruner's
        state; every step by default. Replaying only those keeps a restore linear in the
        history instead of quadratic (each replayed step copies the history before it)."""
        return True


def fmt(value: float) -> str:
    return f"{value:.4g}"
