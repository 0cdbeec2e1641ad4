"""``TrialRunner``: one Experiment's event loop as pure methods.

Events come in as method calls (``step(now)``, ``on_trial_result``, ...); each returns
the decisions (``core.types``) the controller must carry out, in order. The runner
owns trial phases, budgets and the experiment's resource holdings in the shared
``ResourceLedger``; the searcher proposes parameters and the scheduler judges results.
Every rule for "when does a trial start, stop or retry" lives in three files, one
class each, by the events they answer: this one (the loop: create, launch, queue,
time out, finish), runner_events.py (a trial's results, end, failure, pause and
admission) and runner_restart.py (a spec change, a restart).
"""
from __future__ import annotations

import types
from collections import Counter
from typing import Any, Iterable, Mapping

from kubetune.core import admission, budget as budgets, pareto
from kubetune.core.best import BestTrial, best_text
from kubetune.core.curve import cut_back
from kubetune.core.failures import FailureTally
from kubetune.core.resources import ResourceLedger, trial_bundles
from kubetune.core.runner_events import NOT_COUNTED, TrialEvents  # noqa: F401 - NOT_COUNTED: render.py
from kubetune.core.runner_restart import SpecAndRestart
from kubetune.core.schedulers import make_scheduler
from kubetune.core.search import Evaluated, Searcher
from kubetune.core.search_values import latest_values, objective_value
from kubetune.core.warm_room import WarmRooms, short_run
from kubetune.core.warm_trials import WarmTrial
from kubetune.core.trial import TrialInfo
from kubetune.core.usage import experiment_usage
from kubetune.core.types import (
    CreateTrial, Decision, ExperimentSummary, FinishExperiment, LaunchTrial, StopTrial, TrialPhase,
    TrialPhaseChanged,
)
from kubetune.spec.model import ExperimentSpec

REUSED = "Reused"   # the reason of a Trial whose parameters were evaluated before: it never ran
RUNNING, PAUSED, PENDING, QUEUED = TrialPhase.RUNNING, TrialPhase.PAUSED, TrialPhase.PENDING, TrialPhase.QUEUED
SUCCEEDED, FAILED, STOPPED = TrialPhase.SUCCEEDED, TrialPhase.FAILED, TrialPhase.STOPPED


class TrialRunner(TrialEvents, SpecAndRestart):
    def __init__(self, spec: ExperimentSpec, *, experiment: str, start_time: float,
                 ledger: ResourceLedger | None = None, owner: str | None = None,
                 warm_start: Iterable[WarmTrial] = (), warm_start_notes: Iterable[str] = ()) -> None:
        """``ledger`` is shared by every experiment on the same cluster (None: no
        resource limits, only ``parallelism``). A trial holds ledger resources as
        ``f"{owner}{trial}"``: pass a namespace-qualified prefix such as ``"ns/exp/"`` when
        experiments in different namespaces share a ledger (default ``f"{experiment}/"``)."""
        self.spec = spec
        self.experiment = experiment
        self.start_time = start_time
        self.ledger = ledger
        self.rooms = WarmRooms(ledger)    # the rooms of ended trials, kept for the next launch
        self._owner_prefix = owner if owner is not None else f"{experiment}/"
        self.searcher = Searcher(spec, study_name=experiment, warm_start=list(warm_start))
        # what the controller could not find (an Experiment with no Trials) comes first
        self.searcher.warm_start_problems[:0] = list(warm_start_notes)
        self.scheduler = make_scheduler(spec, self.searcher)
        self._trials: dict[str, TrialInfo] = {}
        self._active: dict[str, TrialInfo] = {}        # not terminal, in creation order
        self._counts: Counter[TrialPhase] = Counter()
        self._created = 0
        self._failed = 0
        self._last_error: tuple[str, str] | None = None
        self._failures = FailureTally()   # the Experiment's message names the most common failure
        self._bests = BestTrial(spec)    # the best trial of the (first) objective
        self._bundles = trial_bundles(spec.trial.resources)
        self.finished: FinishExperiment | None = None
        self._front = pareto.FrontCache()
        self._admissions = admission.AdmissionWindow()   # handed to the platform's queue (spec.queue)
        self.spec_rejection = ""   # why the last spec change was (partly) refused; "" if not

    # ------------------------------------------------------------------ views

    @property
    def trials(self) -> Mapping[str, TrialInfo]:
        return types.MappingProxyType(self._trials)

    @property
    def max_trials(self) -> int:
        return self.spec.budget.max_trials

    def owner(self, name: str) -> str:
        """The trial's key in the ledger."""
        return f"{self._owner_prefix}{name}"

    def active_trials(self) -> list[str]:
        """Names of the trials not yet finished (pending, queued, running, paused)."""
        return list(self._active)

    def running_trials(self) -> list[str]:
        """Names of the trials the executor should be running (results are expected)."""
        return [name for name, trial in self._active.items() if trial.phase is RUNNING]

    def summary(self, now: float) -> ExperimentSummary:
        best = self._bests.best
        queued = [t for t in self._active.values() if t.phase is QUEUED]
        queue_reason = ""
        if queued:   # what the queued trials wait for, now (not when each was queued)
            queue_reason = (self.ledger.queue_summary([self.owner(t.name) for t in queued])
                            if self.ledger is not None else "") or queued[0].message
        return ExperimentSummary(
            counts={phase.value: self._counts[phase] for phase in TrialPhase}, created=self._created,
            best_trial=best.trial if best else None, best_params=dict(best.params) if best else None,
            best_metric=best.value if best else None, best_iteration=best.iteration if best else None,
            queue_reason=queue_reason, finished=self.finished, max_trials=self.max_trials,
            outcomes=self._front.get(self), admissions=self._admissions.summary(self.spec.queue, self._trials.values()),
            usage=experiment_usage((t.usage, t.queue_wait_s) for t in self._trials.values()))

    def decision_state(self, name: str) -> dict[str, Any]:
        """What the study and the scheduler keep about a trial, bounded: persisted on the
        Trial so ``restore`` rebuilds the same decisions without any history."""
        trial = self._trials[name]
        state = {"study": self.searcher.trial_state(name), "scheduler": self.scheduler.trial_state(trial)}
        return {key: value for key, value in state.items() if value}

    # ------------------------------------------------------------------ phases

    def _set_phase(self, trial: TrialInfo, phase: TrialPhase) -> None:
        if phase is not RUNNING:
            self._admissions.forget(trial.name)
        self._counts[trial.phase] -= 1
        self._counts[phase] += 1
        trial.phase = phase
        if phase.is_terminal:
            self._active.pop(trial.name, None)

    def _release(self, trial: TrialInfo, now: float | None) -> None:
        """Its room back to the ledger, or kept for a launch the step will make, which then
        starts on the ended run's warm worker (core/warm_room.py; ``now`` None: never)."""
        self.rooms.release(self.owner(trial.name), self.spec.priority, self._keeps_room(trial, now))

    def _keeps_room(self, trial: TrialInfo, now: float | None) -> bool:
        """Not after a run that failed, hung or ran long, and only while fewer rooms are
        kept than the step can launch trials (under parallelism, of those it has or may make)."""
        if now is None or trial.phase is FAILED or len(self._bundles) != 1 or self.finished or self.closed \
                or self.spec.suspend or not short_run(trial.attempt_start, now):
            return False
        limit = self._in_flight_limit()
        creatable = max(0, min(self.max_trials - self._created, limit - len(self._active)))
        launchable = sum(1 for t in self._active.values() if t.launchable) + creatable
        return len(self.rooms) < min(limit - self._counts[RUNNING], launchable)

    def _end(self, trial: TrialInfo, phase: TrialPhase, reason: str, message: str, now: float | None) -> list[Decision]:
        """Make a trial terminal: release its resources and tell the scheduler and study."""
        self._set_phase(trial, phase)
        trial.ended(reason, message, now)
        self._release(trial, now)
        if phase is SUCCEEDED:
            self.scheduler.on_trial_complete(trial)
        elif phase is FAILED:
            self._failed += 1
            self._last_error = (trial.name, message or reason)
            self._failures.failed(trial.name, message or reason)
            self.scheduler.on_trial_error(trial)
        else:
            self.scheduler.on_trial_remove(trial)
        if phase is not FAILED:
            self._failures.ended_otherwise()
        if phase is SUCCEEDED:
            self._bests.judge_constraints(trial, self._trials.values())
        self.searcher.complete(trial.name, trial.last_value, phase, metrics=trial.latest, params=trial.params)
        self._front.changed()
        return [StopTrial(trial.name, phase, reason, message)]

    # ------------------------------------------------------------------ objectives and constraints

    def _has_learned(self) -> bool:
        if self.spec.multi_objective:
            return bool(self._front.get(self).front_size)
        return self._bests.best is not None

    # ------------------------------------------------------------------ the loop

    def step(self, now: float) -> list[Decision]:
        """Finish checks, then create trials up to the budget, then launch what fits; the
        rooms of ended trials that no launch took go back to the ledger's line."""
        try:
            return self._step(now)
        finally:
            self.rooms.let_go()

    def _step(self, now: float) -> list[Decision]:
        if self.closed:       # the controller stopped: no trial created or launched (close())
            return []
        decisions = self._check_finished(now)
        if self.finished:
            return decisions
        decisions += self._check_run_timeouts(now)     # first: a slot it frees is used at once
        if self.spec.suspend or budgets.exhausted(self.spec, self._trials.values()):
            self.withdraw_queued(self._active.values())
            return decisions + self._check_finished(now)
        decisions += self._create_trials()
        decisions += self._launch_runnable(now)
        decisions += self._check_queue_timeouts(now)
        return decisions + self._check_finished(now)

    def _create_trials(self) -> list[Decision]:
        decisions: list[Decision] = []
        while self._created < self.max_trials and len(self._active) < self._in_flight_limit():
            name = f"{self.experiment}-{self._created}"
            params = self.searcher.suggest(name)
            if params is None:
                break
            trial = TrialInfo(name=name, index=self._created, params=params, suggested_params=dict(params))
            self._trials[name] = self._active[name] = trial
            self._counts[PENDING] += 1
            self._created += 1
            self.scheduler.on_trial_add(trial)
            decisions.append(CreateTrial(name, trial.index, dict(params)))
            earlier = self.searcher.evaluated(params)
            if earlier is not None:
                decisions += self._reuse(trial, earlier)
        return decisions

    def _reuse(self, trial: TrialInfo, earlier: Evaluated) -> list[Decision]:
        """Parameters already evaluated (here or in a warm-start Experiment): the Trial
        exists, takes the earlier results and never runs."""
        metrics = {**earlier.metrics, "iteration": 1}
        trial.history, trial.last_metrics, trial.iteration = [metrics], metrics, 1
        trial.latest = latest_values([metrics], self.searcher.tracked_metrics)
        trial.last_value = objective_value(metrics, self.spec.objective.metric)
        if trial.last_value is not None:
            self._bests.record_value(trial, trial.last_value, 1)
        return self._end(trial, SUCCEEDED, REUSED, f"same parameters as {earlier.source}: its results are reused",
                         None)

    def _launch_runnable(self, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        candidates = [t for t in self._active.values() if t.launchable]
        while candidates and self._slot_free() and not self.finished:
            trial = self.scheduler.choose_trial_to_run(candidates)
            if trial is None:
                break
            candidates.remove(trial)
            decisions += self._try_launch(trial, now)
        self.withdraw_queued(candidates)     # not tried: no slot under parallelism, or not chosen
        return decisions

    def _try_launch(self, trial: TrialInfo, now: float) -> list[Decision]:
        """Launch if the ledger grants every bundle; otherwise Queued with the reason."""
        if self.closed:       # the controller stopped: nothing more starts (close())
            return []
        if self.ledger is not None:
            owner = self.owner(trial.name)
            problem = self.ledger.feasibility(self._bundles)
            if problem:
                # Every trial asks for the same resources: if one can never run, none can.
                return self._end(trial, FAILED, "Infeasible", problem, now) + self._finish(
                    now, "Failed", "Infeasible", f"trials cannot run on this cluster: {problem}")
            if not self.rooms.acquire(owner, self._bundles, self.spec.priority):
                reason = self.ledger.queue_reason(owner)
                if trial.phase is QUEUED and trial.message == reason and trial.queued_since is not None:
                    return []       # (one Queued by an older operator is written once, with its queuedSince)
                if trial.queued_since is None:
                    trial.queued_since = now
                self._set_phase(trial, QUEUED)
                trial.reason, trial.message = "InsufficientResources", reason
                return [TrialPhaseChanged(trial.name, QUEUED, trial.reason, reason)]
        if trial.launched:
            trial.attempt += 1
        if trial.queued_since is not None:
            trial.usage.add_queue(max(now - trial.queued_since, 0.0))
        trial.launched, trial.relaunch, trial.queued_since = True, False, None
        trial.attempt_start, trial.launch_deferred = now, False     # a new launch: not deferred (yet)
        start_iteration = trial.checkpoint_iteration if trial.checkpoint else 0
        trial.iteration = start_iteration
        if trial.last_metrics is not None and trial.last_metrics.get("iteration", 0) > start_iteration:
            # The new run redoes what was reported after the checkpoint it starts from: the
            # curve keeps the results that led to that checkpoint.
            trial.history = cut_back(trial.history, start_iteration)
            trial.last_metrics = trial.history[-1] if trial.history else None
        self._set_phase(trial, RUNNING)
        trial.reason = trial.message = ""
        if self.spec.queue:     # it waits in the platform's queue until the platform says it was admitted
            self._admissions.hand_over(trial.name)
        return [LaunchTrial(trial.name, dict(trial.params), trial.checkpoint, start_iteration,
                            trial.attempt, trial.last_seq)]

    # ------------------------------------------------------------------ admission (spec.queue)

    def _slot_free(self) -> bool:
        """Room to launch one more trial: ``parallelism`` bounds the running trials; with
        a queue (spec.queue) the admitted ones, and ``admissionWindow`` the ones waiting for admission (a
        1,000-trial Experiment would otherwise flood a ClusterQueue that admits about one
        workload per cycle)."""
        budget = self.spec.budget
        if not self.spec.queue:
            return self._counts[RUNNING] < budget.parallelism
        return self._admissions.slot_free(self._counts[RUNNING], budget.parallelism, budget.admission_window)

    def _in_flight_limit(self) -> int:
        budget = self.spec.budget
        if not self.spec.queue:
            return budget.parallelism
        return self._admissions.in_flight_limit(budget.parallelism, budget.admission_window)

    def _check_run_timeouts(self, now: float) -> list[Decision]:
        """``spec.trial.timeout``: a run (a launch: first run, retry, resumption) that lasts
        longer is stopped and its trial ends Failed with reason TimedOut.  It is not retried:
        maxFailures is for errors, and a run that hangs or is too slow would most likely do
        the same again; it counts toward maxFailedTrials as any failed trial.  Time spent
        Paused or Queued, or with the launch deferred by the platform, does not count."""
        timeout = self.spec.trial.timeout_s
        if timeout is None:
            return []
        decisions: list[Decision] = []
        for trial in [t for t in self._active.values()
                      if t.phase is RUNNING and t.name not in self._admissions and not t.launch_deferred]:
            if trial.attempt_start is None:      # restored from a Trial that did not record it
                trial.attempt_start = now
            if now - trial.attempt_start >= timeout:
                message = (f"attempt {trial.attempt} ran for {budgets.duration(now - trial.attempt_start)}, "
                           f"longer than spec.trial.timeout {budgets.duration(timeout)}; not retried")
                trial.failure_log.append({"attempt": trial.attempt, "reason": "TimedOut",
                                          "message": message, "time": now})
                decisions += self._end(trial, FAILED, "TimedOut", message, now)
        return decisions

    def _check_queue_timeouts(self, now: float) -> list[Decision]:
        timeout = self.spec.trial.queue_timeout_s
        if timeout is None:
            return []
        decisions: list[Decision] = []
        for trial in [t for t in self._active.values() if t.phase is QUEUED]:
            if trial.queued_since is not None and now - trial.queued_since >= timeout:
                decisions += self._end(trial, FAILED, "QueueTimeout",
                                       f"queued for {budgets.duration(now - trial.queued_since)} "
                                       f"(queueTimeout {budgets.duration(timeout)}): {trial.message}", now)
        return decisions

    # ------------------------------------------------------------------ finishing

    def _best_text(self) -> str:
        return best_text(self.spec, self._bests.best, self._front.get(self) if self.spec.multi_objective else None,
                         self._trials.values())

    def _with_failures(self, text: str) -> str:
        summary = self._failures.summary(self._created)
        return f"{text}; {summary}" if summary else text

    def _check_finished(self, now: float | None) -> list[Decision]:
        if self.finished:
            return []
        systematic = self._failures.systematic(self.max_trials)
        if systematic:   # the rest would fail the same way: stop spending the budget
            return self._finish(now, "Failed", "SystematicFailure", self._with_failures(
                f"stopped after {self._created} trials: {systematic}"))
        limit = budgets.reached(self.spec, self._trials.values(), now=now, start_time=self.start_time,
                                created=self._created, running=self._counts[RUNNING])
        max_failed = self.spec.budget.max_failed_trials
        # maxDuration first, then maxFailedTrials, then used-up hours
        if max_failed is not None and self._failed > max_failed and (not limit or limit[0] == budgets.BUDGET_EXHAUSTED):
            name, error = self._last_error
            return self._finish(now, "Failed", "MaxFailedTrialsReached",
                                f"{self._failed} trials failed (maxFailedTrials is {max_failed}); "
                                f"last error: {name}: {error}; {self._failures.most_often()}")
        if limit:
            reason, what = limit
            return self._finish(now, self._outcome(), reason, self._with_failures(f"{what}; {self._best_text()}"))
        if self._active:
            return []
        if self._created >= self.max_trials:
            return self._finish(now, self._outcome(), "MaxTrialsReached",
                                self._with_failures(f"all {self._created} trials done; {self._best_text()}"))
        if self.searcher.exhausted:
            return self._finish(now, self._outcome(), "SearchSpaceExhausted",
                                self._with_failures(f"all {self.searcher.grid_size} grid points tried; "
                                                    f"{self._best_text()}"))
        return []

    def _outcome(self) -> str:
        """How a finishing experiment ends: one that learned nothing, or whose every trial
        failed, did not succeed. Asked only when it finishes: with several objectives,
        learning means a Pareto front, whose computation grows with the trials (asked on
        every result, it made a 1,000-trial NSGA-II run quadratic)."""
        learned = self._has_learned() and self._counts[FAILED] < self._created
        return "Succeeded" if learned else "Failed"

    def _finish(self, now: float | None, phase: str, reason: str, message: str) -> list[Decision]:
        decisions: list[Decision] = []
        for trial in list(self._active.values()):
            decisions += self._end(trial, STOPPED, "ExperimentFinished", f"experiment finished: {reason}", now)
        self.rooms.let_go()     # (finished outside a step too: on a result)
        self.finished = FinishExperiment(phase, reason, message)
        return decisions + [self.finished]

    def stop_all(self, now: float, reason: str = "ExperimentDeleted") -> list[Decision]:
        """Stop every unfinished trial and give back all resources (the Experiment is gone)."""
        decisions: list[Decision] = []
        for trial in list(self._active.values()):
            decisions += self._end(trial, STOPPED, reason, "", now)
        self.rooms.let_go()
        return decisions
