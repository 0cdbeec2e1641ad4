"""The runner's answers to a spec edited while the Experiment runs (GitOps: what of it
is taken is core/spec_change.py's) and to an operator restart (rebuilt from the
persisted Trials).  ``SpecAndRestart`` is a part of ``TrialRunner`` (runner.py) and
works on its state; pure."""
from __future__ import annotations

from typing import Iterable

from kubetune.core import budget as budgets
from kubetune.core.resources import ResourceLedger, trial_bundles
from kubetune.core.schedulers import Action, SchedulerDecision
from kubetune.core.search_values import objective_value, record_latest
from kubetune.core.spec_change import accept_spec_change
from kubetune.core.trial import TrialInfo, from_record
from kubetune.core.types import Decision, FinishExperiment, TrialPhase, TrialPhaseChanged, TrialRecord
from kubetune.core.values import is_finite
from kubetune.core.warm_room import WarmRooms
from kubetune.spec.model import ExperimentSpec

RUNNING, PAUSED, PENDING, QUEUED = TrialPhase.RUNNING, TrialPhase.PAUSED, TrialPhase.PENDING, TrialPhase.QUEUED
SUCCEEDED, FAILED = TrialPhase.SUCCEEDED, TrialPhase.FAILED


class SpecAndRestart:
    # ------------------------------------------------------------------ spec changes

    def on_spec_changed(self, spec: ExperimentSpec, now: float) -> list[Decision]:
        """Apply a new spec to the running experiment (GitOps): what of it is taken
        (core/spec_change.py) takes effect; ``spec_rejection`` says what was refused."""
        old = self.spec
        self.spec, problems = accept_spec_change(old, spec, self._created)
        self.spec_rejection = "; ".join(problems)
        self._bundles = trial_bundles(self.spec.trial.resources)
        self._reopen_if_allowed()
        decisions: list[Decision] = []
        if self.spec.suspend and not old.suspend:
            decisions += self._suspend(now)
        elif old.suspend and not self.spec.suspend:
            for trial in self._active.values():
                if trial.reason == "Suspended":
                    trial.relaunch = trial.phase is PAUSED
                    trial.reason = trial.message = ""
        return decisions + self.step(now)

    def _suspend(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for trial in list(self._active.values()):
            if trial.phase is RUNNING:
                decisions += self._pause(trial, SchedulerDecision(Action.PAUSE, "Suspended", "spec.suspend is true"), now)
            elif trial.phase is PAUSED:
                trial.relaunch = False
                trial.reason, trial.message = "Suspended", "spec.suspend is true"
            elif trial.phase is QUEUED:
                if self.ledger is not None:
                    self.ledger.clear_waiting(self.owner(trial.name))
                self._set_phase(trial, PENDING)
                trial.reason, trial.message, trial.queued_since = "Suspended", "spec.suspend is true", None
                decisions.append(TrialPhaseChanged(trial.name, PENDING, trial.reason, trial.message))
        return decisions

    closed = False      # set by close(): the controller stopped

    def close(self) -> None:
        """The controller stops (the Experiment deleted or re-created): nothing more is
        launched or joins the ledger's line.  A failed trial's retry, polled after the stop,
        would take room (or hold a place in line) that nobody is left to use or give back,
        and a same-named Experiment created next could not acquire its trial's key."""
        self.closed = True
        self.withdraw_queued(self._active.values())
        self.rooms.let_go()

    def withdraw_queued(self, trials: Iterable[TrialInfo]) -> None:
        """Queued ``trials`` this runner will not try now (its budget used up, no slot under
        ``parallelism``, the Experiment deleted) leave the ledger's line: a request that
        fits, left there, holds back the requests of equal priority behind it, and is never
        taken (issue 26).  Tried again, a trial joins the line anew, at its end."""
        if self.ledger is None:
            return
        for trial in list(trials):
            if trial.phase is QUEUED:
                self.ledger.clear_waiting(self.owner(trial.name))

    def _reopen_if_allowed(self) -> None:
        """After a spec change: a finished run goes on where the change lifts what ended it."""
        finished, budget = self.finished, self.spec.budget
        if finished is None:
            return
        if (finished.reason == "MaxTrialsReached" and self.max_trials > self._created   # as Katib
                or finished.reason == "Infeasible"          # the next launch checks the resources again
                or finished.reason == budgets.BUDGET_EXHAUSTED
                and not budgets.exhausted(self.spec, self._trials.values())
                or finished.reason == "MaxFailedTrialsReached"
                and (budget.max_failed_trials is None or self._failed <= budget.max_failed_trials)):
            self.finished = None

    # ------------------------------------------------------------------ restart

    def restore_outcome(self, outcome: FinishExperiment, *, spec_changed: bool) -> None:
        """The Experiment had finished before the restart: it stays finished, and starts
        nothing, unless its spec changed since in a way that reopens it."""
        self.finished = outcome
        if spec_changed:
            self._reopen_if_allowed()

    def attach_ledger(self, ledger: ResourceLedger) -> None:
        """Join the cluster's shared ledger after a ``restore`` done without one (in a
        thread, off the loop that owns the ledger): running trials keep their resources."""
        self.ledger = ledger
        self.rooms = WarmRooms(ledger)
        for trial in self._active.values():
            if trial.phase is RUNNING:
                ledger.adopt(self.owner(trial.name), self._bundles)

    def restore(self, records: Iterable[TrialRecord]) -> None:
        """Rebuild from the persisted Trials after an operator restart, before any step.
        Running trials are assumed still running (the controller re-attaches to them) and
        keep their resources; Paused ones resume unless suspended; the study and the
        scheduler are rebuilt so no parameters repeat and pruning sees full histories."""
        if self._trials:
            raise RuntimeError("restore() must be called on a fresh runner")
        records = sorted(records, key=lambda r: r.index)
        for record in records:
            trial = self._trial_from_record(record)
            self._trials[trial.name] = trial
            self._counts[trial.phase] += 1
            if not trial.phase.is_terminal:
                self._active[trial.name] = trial
            if trial.phase is FAILED:
                self._failed += 1
                self._last_error = (trial.name, trial.message or trial.reason)
                self._failures.failed(trial.name, trial.message or trial.reason)
            elif trial.phase.is_terminal:
                self._failures.ended_otherwise()
            if trial.phase is RUNNING and self.ledger is not None:
                self.ledger.adopt(self.owner(trial.name), self._bundles)
            if trial.phase is RUNNING and self.spec.queue:
                self._admissions.hand_over(trial.name, restored=True)
        self._created = records[-1].index + 1 if records else 0
        if self._created > self.max_trials:
            self.spec_rejection = (f"spec.budget.maxTrials: {self.max_trials} is below the {self._created} "
                                   f"trials already created; no new trials will start")
        states = {r.name: dict((r.decision_state or {}).get("scheduler") or {}) for r in records}
        self.searcher.rebuild(records, replay=lambda: self.scheduler.restore(self._trials.values(), states))
        self._front.changed()

    def _trial_from_record(self, record: TrialRecord) -> TrialInfo:
        """Rebuilt from the bounded status alone (curve, last and best values, decision
        state); a Trial written before those fields existed is read from its history."""
        trial = from_record(record, suspended=self.spec.suspend)
        iteration = trial.iteration
        history = trial.history
        # the persisted values outlive a downsampled history
        trial.latest.update(record_latest(record, self.searcher.tracked_metrics))
        if record.last_value is not None or record.best_value is not None:
            trial.last_value = record.last_value
            if is_finite(record.best_value):
                self._bests.record_value(trial, record.best_value, record.best_iteration or iteration)
        else:   # a Trial written before the bounded status: from its history
            metric = self.spec.objective.metric
            for position, metrics in enumerate(history, start=1):
                value = objective_value(metrics, metric)
                if value is not None:
                    trial.last_value = value
                    self._bests.record_value(trial, value, metrics.get("iteration", position))
        if trial.phase is SUCCEEDED:
            self._bests.judge_constraints(trial, self._trials.values())
        return trial
