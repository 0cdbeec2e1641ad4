"""``TrialRunner``: one Experiment's event loop as pure methods.

Events come in as method calls (``step(now)``, ``on_trial_result``, ...); each returns
the decisions (``core.types``) the controller must carry out, in order. The runner
owns trial phases, budgets and the experiment's resource holdings in the shared
``ResourceLedger``; the searcher proposes parameters and the scheduler judges results.
Every rule for "when does a trial start, stop or retry" lives in this file.
"""
from __future__ import annotations

import dataclasses
import types
from collections import Counter
from typing import Any, Iterable, Mapping

from kubetune.core.failures import OBJECTIVE_NOT_A_NUMBER, FailureTally, wrong_type
from kubetune.core.resources import ResourceLedger, trial_bundles
from kubetune.core.schedulers import CONTINUE, Action, SchedulerDecision, make_scheduler
from kubetune.core import admission, pareto
from kubetune.core.curve import add_point, cut_back
from kubetune.core.search import Evaluated, Searcher, WarmTrial, latest_values, objective_value, record_latest
from kubetune.core.trial import KEPT_LINEAGE, TrialInfo
from kubetune.core.values import is_finite, judged
from kubetune.core.types import (
    CreateTrial, Decision, ExperimentSummary, FinishExperiment, LaunchTrial, PauseTrial, Result,
    StopTrial, TrialPhase, TrialPhaseChanged, TrialRecord,
)
from kubetune.spec.model import ExperimentSpec

REUSED = "Reused"   # the reason of a Trial whose parameters were evaluated before: it never ran
RUNNING, PAUSED, PENDING, QUEUED = TrialPhase.RUNNING, TrialPhase.PAUSED, TrialPhase.PENDING, TrialPhase.QUEUED
SUCCEEDED, FAILED, STOPPED = TrialPhase.SUCCEEDED, TrialPhase.FAILED, TrialPhase.STOPPED


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"


@dataclasses.dataclass(frozen=True)
class _Best:
    value: float
    trial: str
    iteration: int
    params: Mapping[str, Any]


class TrialRunner:
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
        self._best: _Best | None = None
        self._bundles = trial_bundles(spec.trial.resources)
        self.finished: FinishExperiment | None = None
        self._front = pareto.FrontCache()
        # launched trials the platform's queue has not admitted yet (spec.queue): RUNNING to
        # the runner (the platform watches them) but holding no parallelism slot; at most
        # spec.budget.admissionWindow of them (core/admission.may_hand_over)
        self._awaiting_admission: set[str] = set()
        # of those, the ones the queue found no room for at the last poll: the queue is full
        self._queue_full: set[str] = set()
        # after a restart: running trials whose admission is not known yet (counted in the
        # window until the first poll says; an admission seen then was counted before)
        self._admission_unknown: set[str] = set()
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
        best = self._best
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
            outcomes=self._front.get(self), admissions=self._admission_summary())

    def _admission_summary(self) -> dict[str, Any] | None:
        """Admissions, queue wait and evictions over every trial (a fixed-size summary)."""
        trials = self._trials.values()
        admissions = sum(t.queue_waits for t in trials)
        evictions = sum(t.evictions for t in trials)
        if not (self.spec.queue or admissions or evictions or self._awaiting_admission):
            return None
        total = sum(t.queue_wait_s for t in trials)
        longest = max((t.queue_wait_s for t in trials), default=0.0)   # one trial's, all its attempts
        return {"admissions": admissions, "waitingForAdmission": len(self._awaiting_admission),
                "evictions": evictions,
                "queueWaitSeconds": {"total": round(total, 3), "mean": round(total / admissions, 3) if admissions else 0.0,
                                     "max": round(longest, 3)}}

    def decision_state(self, name: str) -> dict[str, Any]:
        """What the study and the scheduler keep about a trial, bounded: persisted on the
        Trial so ``restore`` rebuilds the same decisions without any history."""
        trial = self._trials[name]
        state = {"study": self.searcher.trial_state(name), "scheduler": self.scheduler.trial_state(trial)}
        return {key: value for key, value in state.items() if value}

    # ------------------------------------------------------------------ phases

    def _set_phase(self, trial: TrialInfo, phase: TrialPhase) -> None:
        if phase is not RUNNING:
            self._awaiting_admission.discard(trial.name)
            self._admission_unknown.discard(trial.name)
            self._queue_full.discard(trial.name)
        self._counts[trial.phase] -= 1
        self._counts[phase] += 1
        trial.phase = phase
        if phase.is_terminal:
            self._active.pop(trial.name, None)

    def _release(self, trial: TrialInfo) -> None:
        if self.ledger is not None:
            self.ledger.release(self.owner(trial.name))

    def _end(self, trial: TrialInfo, phase: TrialPhase, reason: str, message: str, now: float | None) -> list[Decision]:
        """Make a trial terminal: release its resources and tell the scheduler and study."""
        self._set_phase(trial, phase)
        trial.reason, trial.message, trial.completion_time, trial.relaunch = reason, message, now, False
        self._release(trial)
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
            self._judge_constraints(trial)
        self.searcher.complete(trial.name, trial.last_value, phase, metrics=trial.latest, params=trial.params)
        self._front.changed()
        return [StopTrial(trial.name, phase, reason, message)]

    # ------------------------------------------------------------------ objectives and constraints

    def _feasible(self, latest: Mapping[str, float]) -> bool:
        return all(c.violation(latest.get(c.metric)) <= 0 for c in self.spec.constraints)

    def _judge_constraints(self, trial: TrialInfo) -> None:
        """A finished trial whose final results break a constraint is marked, and can be
        neither the best trial nor on the Pareto front."""
        broken = [c.describe(trial.latest.get(c.metric)) for c in self.spec.constraints
                  if c.violation(trial.latest.get(c.metric)) > 0]
        trial.infeasible = "; ".join(broken)
        if trial.infeasible and self._best is not None and self._best.trial == trial.name:
            self._best = None
            for other in self._trials.values():
                if other.infeasible or other.best_value is None or (
                        other.phase is not SUCCEEDED and not self._feasible(other.latest)):
                    continue
                self._offer_best(other.best_value, other, other.best_iteration)

    def _record_value(self, trial: TrialInfo, value: float, iteration: int) -> None:
        """Best-so-far bookkeeping of the (first) objective: the trial's own best always,
        the experiment's only with one objective (several have a Pareto front instead)
        and only from results within the constraints."""
        objective = self.spec.objective
        if not is_finite(value):        # never best (core/values.py)
            return
        if trial.best_value is None or objective.better(value, trial.best_value):
            trial.best_value, trial.best_iteration = value, iteration
        if self.spec.multi_objective or not self._feasible(trial.latest):
            return
        self._offer_best(value, trial, iteration)

    def _offer_best(self, value: float, trial: TrialInfo, iteration: int) -> None:
        """The experiment's best becomes ``trial``'s ``value`` if that is better: the one
        place the best trial changes, but for a trial found infeasible (reset, above)."""
        if self._best is None or self.spec.objective.better(value, self._best.value):
            self._best = _Best(value, trial.name, iteration, dict(trial.params))

    def _has_learned(self) -> bool:
        if self.spec.multi_objective:
            return bool(self._front.get(self).front_size)
        return self._best is not None

    # ------------------------------------------------------------------ the loop

    def step(self, now: float) -> list[Decision]:
        """Finish checks, then create trials up to the budget, then launch what fits."""
        decisions = self._check_finished(now)
        if self.finished:
            return decisions
        decisions += self._check_run_timeouts(now)     # first: a slot it frees is used at once
        if self.spec.suspend:
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
            self._record_value(trial, trial.last_value, 1)
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
        return decisions

    def _try_launch(self, trial: TrialInfo, now: float) -> list[Decision]:
        """Launch if the ledger grants every bundle; otherwise Queued with the reason."""
        if self.ledger is not None:
            owner = self.owner(trial.name)
            problem = self.ledger.feasibility(self._bundles)
            if problem:
                # Every trial asks for the same resources: if one can never run, none can.
                return self._end(trial, FAILED, "Infeasible", problem, now) + self._finish(
                    now, "Failed", "Infeasible", f"trials cannot run on this cluster: {problem}")
            self.ledger.set_waiting(owner, self._bundles, self.spec.priority)
            if not self.ledger.try_acquire(owner, self._bundles, self.spec.priority):
                reason = self.ledger.queue_reason(owner)
                if trial.queued_since is None:
                    trial.queued_since = now
                if trial.phase is QUEUED and trial.message == reason:
                    return []
                self._set_phase(trial, QUEUED)
                trial.reason, trial.message = "InsufficientResources", reason
                return [TrialPhaseChanged(trial.name, QUEUED, trial.reason, reason)]
        if trial.launched:
            trial.attempt += 1
        trial.launched, trial.relaunch, trial.queued_since = True, False, None
        trial.attempt_start = now
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
            self._awaiting_admission.add(trial.name)
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
        waiting = len(self._awaiting_admission)
        return admission.may_hand_over(self._counts[RUNNING] - waiting, waiting, budget.parallelism,
                                       budget.admission_window, bool(self._queue_full))

    def _in_flight_limit(self) -> int:
        budget = self.spec.budget
        if not self.spec.queue:
            return budget.parallelism
        return admission.in_flight_limit(budget.parallelism, budget.admission_window, bool(self._queue_full))

    def awaiting_admission(self) -> list[str]:
        return sorted(self._awaiting_admission)

    def on_admission(self, name: str, waiting: bool, now: float, queue_wait_s: float | None = None,
                     queue_full: bool = False) -> list[Decision]:
        """What the platform says of a running trial: ``waiting`` for its queue's admission
        (Queued or Provisioning; not running, not a failure; ``queue_full`` if the queue found no
        quota for it), or admitted after ``queue_wait_s`` seconds in the queue.  An admission
        frees a place in the window; one beyond ``parallelism`` (the queue admitted several
        waiting trials at once) is given back: paused, it waits for a slot, not counted."""
        trial = self._trials.get(name)
        if trial is None or trial.phase is not RUNNING:
            return []
        if waiting:
            self._awaiting_admission.add(name)
            self._admission_unknown.discard(name)
            if queue_full:
                self._queue_full.add(name)
            else:
                self._queue_full.discard(name)
            return []
        if name not in self._awaiting_admission:
            return []
        self._queue_full.discard(name)
        # trials confirmed admitted: after a restart, only those seen admitted since (all
        # restored running trials start out awaiting), so at most parallelism pass below
        admitted_before = self._counts[RUNNING] - len(self._awaiting_admission)
        self._awaiting_admission.discard(name)
        # admitted before the restart or while the operator was down: its queue wait is
        # unknown (not counted) and its run started when recorded, but it still goes
        # through the parallelism check (the queue may have admitted window trials meanwhile)
        restored = name in self._admission_unknown
        self._admission_unknown.discard(name)
        if admitted_before >= self.spec.budget.parallelism and not self.spec.suspend:
            decisions = self._pause(trial, SchedulerDecision(
                Action.PAUSE, admission.BEYOND_PARALLELISM,
                f"admitted while {admitted_before} trials run (parallelism "
                f"{self.spec.budget.parallelism}): given back, relaunched when a trial ends"), now)
            trial.relaunch = True
            return decisions
        trial.admitted_attempt = trial.attempt
        if not restored:
            if queue_wait_s is not None:
                trial.queue_wait_s += queue_wait_s
                trial.queue_waits += 1
            trial.attempt_start = now      # spec.trial.timeout counts the run, not the wait in the queue
        return [] if self.finished or self.spec.suspend else self._launch_runnable(now)

    def _check_run_timeouts(self, now: float) -> list[Decision]:
        """``spec.trial.timeout``: a run (a launch: first run, retry, resumption) that lasts
        longer is stopped and its trial ends Failed with reason TimedOut.  It is not retried:
        maxFailures is for errors, and a run that hangs or is too slow would most likely do
        the same again; it counts toward maxFailedTrials as any failed trial.  Time spent
        Paused or Queued does not count."""
        timeout = self.spec.trial.timeout_s
        if timeout is None:
            return []
        decisions: list[Decision] = []
        for trial in [t for t in self._active.values() if t.phase is RUNNING and t.name not in self._awaiting_admission]:
            if trial.attempt_start is None:      # restored from a Trial that did not record it
                trial.attempt_start = now
            if now - trial.attempt_start >= timeout:
                message = (f"attempt {trial.attempt} ran for {_duration(now - trial.attempt_start)}, "
                           f"longer than spec.trial.timeout {_duration(timeout)}; not retried")
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
                                       f"queued for {_duration(now - trial.queued_since)} "
                                       f"(queueTimeout {_duration(timeout)}): {trial.message}", now)
        return decisions

    # ------------------------------------------------------------------ finishing

    def _best_text(self) -> str:
        if self.spec.multi_objective:
            outcomes = self._front.get(self)
            return f"Pareto front of {outcomes.front_size if outcomes else 0} trials"
        best = self._best
        if best is None:
            metric = self.spec.objective.metric
            # reported, but never a finite value: say so, not that nothing came
            nonfinite = sum(1 for t in self._trials.values() if t.last_value is not None)
            if nonfinite:
                return (f"no best {metric}: every value the {nonfinite} trial{'s' * (nonfinite != 1)} reported was NaN or ±Infinity, "
                        f"and a non-finite value never counts as best (diverging training? narrow the "
                        f"search space, e.g. lower learning rates, or report a finite {metric})")
            return f"no trial reported {metric}"
        return f"best {self.spec.objective.metric} {best.value:.6g} ({best.trial}, iteration {best.iteration})"

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
        budget = self.spec.budget
        # An experiment that learned nothing, or whose every trial failed, did not succeed.
        learned = self._has_learned() and self._counts[FAILED] < self._created
        outcome = "Succeeded" if learned else "Failed"
        if budget.max_duration_s is not None and now is not None and now - self.start_time >= budget.max_duration_s:
            return self._finish(now, outcome, "MaxDurationReached",
                                self._with_failures(f"maxDuration {_duration(budget.max_duration_s)} reached after "
                                                    f"{self._created} trials; {self._best_text()}"))
        if budget.max_failed_trials is not None and self._failed > budget.max_failed_trials:
            name, error = self._last_error
            return self._finish(now, "Failed", "MaxFailedTrialsReached",
                                f"{self._failed} trials failed (maxFailedTrials is {budget.max_failed_trials}); "
                                f"last error: {name}: {error}; {self._failures.most_often()}")
        if self._active:
            return []
        if self._created >= self.max_trials:
            return self._finish(now, outcome, "MaxTrialsReached",
                                self._with_failures(f"all {self._created} trials done; {self._best_text()}"))
        if self.searcher.exhausted:
            return self._finish(now, outcome, "SearchSpaceExhausted",
                                self._with_failures(f"all {self.searcher.grid_size} grid points tried; "
                                                    f"{self._best_text()}"))
        return []

    def _finish(self, now: float | None, phase: str, reason: str, message: str) -> list[Decision]:
        decisions: list[Decision] = []
        for trial in list(self._active.values()):
            decisions += self._end(trial, STOPPED, "ExperimentFinished", f"experiment finished: {reason}", now)
        self.finished = FinishExperiment(phase, reason, message)
        return decisions + [self.finished]

    def stop_all(self, now: float, reason: str = "ExperimentDeleted") -> list[Decision]:
        """Stop every unfinished trial and give back all resources (the Experiment is gone)."""
        decisions: list[Decision] = []
        for trial in list(self._active.values()):
            decisions += self._end(trial, STOPPED, reason, "", now)
        return decisions

    # ------------------------------------------------------------------ trial events

    def on_trial_launched(self, name: str, now: float) -> list[Decision]:
        trial = self._trials.get(name)
        if trial is not None and trial.start_time is None:
            trial.start_time = now
        return []

    def _record_objective(self, trial: TrialInfo, metrics: Mapping[str, Any], iteration: int) -> float | None:
        """The one update of a trial's values from a result: the latest value of every
        tracked metric, the last and best objective, the study's intermediate value.
        A non-finite objective is the worst there is: it is the trial's last value, the
        study sees it as NaN (diverged), and it is never anyone's best (core/values.py)."""
        trial.latest.update(latest_values([metrics], self.searcher.tracked_metrics))
        value = objective_value(metrics, self.spec.objective.metric)
        if value is None:
            return None
        trial.last_value = value
        self.searcher.report_intermediate(trial.name, iteration, judged(value))
        self._record_value(trial, value, iteration)
        return value

    def on_trial_result(self, name: str, result: Result, now: float) -> list[Decision]:
        """Record one result (once: by seq) and act on the scheduler's judgement. Results of
        a trial the runner already decided to stop or pause are dropped (Syne Tune)."""
        trial = self._trials.get(name)
        if trial is None or trial.phase is not RUNNING or result.seq <= trial.last_seq:
            return []
        if result.attempt is not None and result.attempt != trial.attempt:
            return []
        trial.last_seq = result.seq
        trial.iteration = result.iteration
        metrics = {**result.metrics, "iteration": result.iteration}
        trial.history, trial.history_stride = add_point(trial.history, trial.history_stride, metrics)
        trial.last_metrics = metrics
        if result.checkpoint:
            trial.checkpoint, trial.checkpoint_iteration = result.checkpoint, result.iteration
        value = self._record_objective(trial, result.metrics, result.iteration)
        objective = self.spec.objective
        if is_finite(value) and not self.spec.multi_objective and self._feasible(trial.latest) \
                and objective.reached(value):
            message = (f"{name} reported {objective.metric} {value:.6g} at iteration "
                       f"{result.iteration} (goal {objective.goal:g})")
            return self._end(trial, SUCCEEDED, "GoalReached", message, now) + self._finish(
                now, "Succeeded", "GoalReached", message)
        # The scheduler sees every result, the last one too (as an Optuna pruner would);
        # a non-finite value as NaN, the worst (core/values.py).
        decision = self.scheduler.on_trial_result(trial, judged(value)) if value is not None else CONTINUE
        cap = self.spec.scheduler.max_iterations
        if cap is not None and result.iteration >= cap:
            return self._end(trial, SUCCEEDED, "MaxIterationsReached", f"reached maxIterations {cap}", now) \
                + self._check_finished(now)
        if decision.action is Action.STOP:
            return self._end(trial, STOPPED, decision.reason, decision.message, now) + self._check_finished(now)
        if decision.action is Action.PAUSE:
            return self._pause(trial, decision, now)
        return []

    def _pause(self, trial: TrialInfo, decision: SchedulerDecision, now: float) -> list[Decision]:
        self._set_phase(trial, PAUSED)
        trial.reason, trial.message = decision.reason, decision.message
        self._release(trial)
        donor = self._trials.get(decision.clone_from) if decision.clone_from else None
        decisions: list[Decision] = [PauseTrial(trial.name, decision.reason, decision.message,
                                                clone_from=donor.name if donor is not None else None)]
        if donor is None:
            return decisions
        # PBT exploit: continue from the donor's checkpoint with explored parameters.
        trial.params = dict(decision.new_params or donor.params)
        trial.parent = donor.name
        trial.checkpoint, trial.checkpoint_iteration = donor.checkpoint, donor.checkpoint_iteration
        trial.lineage.append({"iteration": donor.checkpoint_iteration, "from": donor.name,
                              "params": dict(trial.params)})
        del trial.lineage[:-KEPT_LINEAGE]
        trial.relaunch = True
        if not self._slot_free():
            return decisions        # parallelism was lowered: the next step relaunches it
        return decisions + self._try_launch(trial, now)

    def borrowed_checkpoint(self, name: str) -> str | None:
        """The checkpoint a live trial is to continue from, if it lies in another trial's
        storage (``<storage>/<owner>/checkpoint-*``, a PBT exploit): that trial's retention
        may delete it, so the controller copies it into this trial's own storage first."""
        trial = self._trials.get(name)
        if trial is None or trial.phase.is_terminal or not trial.checkpoint:
            return None
        return None if f"/{self.owner(name)}/" in trial.checkpoint else trial.checkpoint

    def on_checkpoint_cloned(self, name: str, source: str, location: str | None) -> bool:
        """The trial's borrowed checkpoint ``source`` now has a copy of its own at ``location``
        (None: ``source`` was refused, outside the Experiment's storage; it starts afresh)."""
        trial = self._trials.get(name)
        if trial is None or trial.phase.is_terminal or trial.checkpoint != source:
            return False
        trial.checkpoint = location
        return True

    def on_trial_completed(self, name: str, now: float) -> list[Decision]:
        """The trial's function returned."""
        trial = self._trials.get(name)
        if trial is None or trial.phase is not RUNNING:
            return []
        metric = self.spec.objective.metric
        wrong = wrong_type(trial.history, metric) if trial.last_value is None else ""
        if wrong:   # it did report the objective, as something no search can compare
            return self._end(trial, FAILED, OBJECTIVE_NOT_A_NUMBER, wrong, now) + self._check_finished(now)
        message = "" if trial.last_value is not None else f"the function returned without reporting {metric}"
        return self._end(trial, SUCCEEDED, "Completed", message, now) + self._check_finished(now)

    def on_trial_paused(self, name: str, results: Iterable[Result]) -> None:
        """The results a trial reported between the decision to pause it and the report that
        carried its pausing checkpoint: recorded, not judged, so that it resumes from that
        checkpoint. A trial given another checkpoint meanwhile (a PBT exploit) ignores them."""
        trial = self._trials.get(name)
        if trial is None or trial.phase is not PAUSED or trial.relaunch:
            return
        for result in results:
            if result.seq <= trial.last_seq or result.attempt not in (None, trial.attempt):
                continue
            trial.last_seq, trial.iteration = result.seq, result.iteration
            trial.last_metrics = {**result.metrics, "iteration": result.iteration}
            trial.history, trial.history_stride = add_point(trial.history, trial.history_stride, trial.last_metrics)
            if result.checkpoint:
                trial.checkpoint, trial.checkpoint_iteration = result.checkpoint, result.iteration
            self._record_objective(trial, result.metrics, result.iteration)

    def on_trial_errored(self, name: str, error: str, now: float, *, cluster_fault: bool = False,
                         evicted: str = "") -> list[Decision]:
        """The trial raised (or its actor died). Retry from the latest checkpoint while
        failures <= maxFailures; a ``cluster_fault`` (node lost, preemption) is retried
        without counting against maxFailures.  ``evicted`` (Preempted, Evicted): the platform's queue took
        the trial's quota back; a pause, not a failure: it resumes from its checkpoint
        when admitted again, and an ASHA rung it was in stays open."""
        trial = self._trials.get(name)
        if trial is None or trial.phase is not RUNNING:
            return []
        self._release(trial)
        if evicted:
            cluster_fault = True
            trial.evictions += 1
        trial.failure_log.append({"attempt": trial.attempt, "reason": evicted or ("ClusterFault" if cluster_fault else "Error"),
                                  "message": error, "time": now})
        if cluster_fault:
            _forget_old_cluster_faults(trial.failure_log)
        if not cluster_fault:
            trial.failures += 1
        if not cluster_fault and trial.failures > self.spec.trial.max_failures:
            return self._end(trial, FAILED, "Error", error, now) + self._check_finished(now)
        where = f"checkpoint at iteration {trial.checkpoint_iteration}" if trial.checkpoint else "the start"
        if evicted:
            message = f"attempt {trial.attempt}: {error}; resumes from {where} when admitted again"
        else:
            message = f"attempt {trial.attempt} failed: {error}; retrying from {where}"
        self._set_phase(trial, PENDING)
        trial.reason, trial.message = evicted or "Retrying", message
        # A cluster fault waits for the next step: the cluster that just failed the trial
        # (or its launch) may still be down, and relaunching at once from here would
        # recurse launch -> error -> launch for as long as it is.
        if not cluster_fault and not self.spec.suspend and self._slot_free():
            return self._try_launch(trial, now)
        return [TrialPhaseChanged(name, PENDING, trial.reason, message)]

    def request_stop(self, name: str, now: float | None = None) -> list[Decision]:
        """Stop one trial at once (pending, queued, paused or running). Deliver a running
        trial's outstanding results first: they are ignored afterwards. Without ``now``
        the trial gets no completion time and the wall-clock limit is checked at the next step."""
        trial = self._trials.get(name)
        if trial is None or trial.phase.is_terminal:
            return []
        return self._end(trial, STOPPED, "StopRequested", "stopped on request", now) + self._check_finished(now)

    # ------------------------------------------------------------------ spec changes

    def on_spec_changed(self, spec: ExperimentSpec, now: float) -> list[Decision]:
        """Apply a new spec to the running experiment (GitOps). Budgets, suspend, priority
        and the trial template take effect; what the study and scheduler were built on
        cannot change, nor can maxTrials drop below the trials already created: those
        parts keep their old values and ``spec_rejection`` says why."""
        old = self.spec
        problems = []
        for path, before, after in (("spec.objective.metric", old.objective.metric, spec.objective.metric),
                                    ("spec.objective.mode", old.objective.mode, spec.objective.mode),
                                    ("spec.objectives", old.objectives, spec.objectives),
                                    ("spec.constraints", old.constraints, spec.constraints),
                                    ("spec.warmStart", old.warm_start, spec.warm_start),
                                    ("spec.searchSpace", old.search_space, spec.search_space),
                                    ("spec.search", old.search, spec.search),
                                    ("spec.scheduler", old.scheduler, spec.scheduler)):
            if before != after:
                problems.append(f"{path}: cannot change while the experiment runs; create a new Experiment")
        budget = spec.budget
        if budget.max_trials < self._created:
            problems.append(f"spec.budget.maxTrials: cannot lower to {budget.max_trials}: {self._created} "
                            f"trials already exist; set it to {self._created} or more")
            budget = dataclasses.replace(budget, max_trials=old.budget.max_trials)
        self.spec = dataclasses.replace(
            spec, objective=dataclasses.replace(spec.objective, metric=old.objective.metric, mode=old.objective.mode),
            objectives=old.objectives, constraints=old.constraints, warm_start=old.warm_start,
            reference_point=old.reference_point,
            search_space=old.search_space, search=old.search, scheduler=old.scheduler, budget=budget)
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

    def _reopen_if_allowed(self) -> None:
        """After a spec change: a finished run goes on where the change lifts what ended it."""
        finished, budget = self.finished, self.spec.budget
        if finished is None:
            return
        if (finished.reason == "MaxTrialsReached" and self.max_trials > self._created   # as Katib
                or finished.reason == "Infeasible"          # the next launch checks the resources again
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
                self._awaiting_admission.add(trial.name)
                self._admission_unknown.add(trial.name)
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
        history: list[Mapping[str, Any]] = []
        stride = record.history_stride
        for point in record.history:    # already a curve: unchanged; a full old history: thinned
            history, stride = add_point(history, stride, dict(point))
        iteration = record.iteration
        if iteration is None:
            iteration = history[-1].get("iteration", len(history)) if history else 0
        last_metrics = dict(record.last_metrics) if record.last_metrics is not None else \
            history[-1] if history else None
        trial = TrialInfo(
            name=record.name, index=record.index, phase=record.phase,
            params=dict(record.lineage[-1]["params"]) if record.lineage else dict(record.params),
            suggested_params=dict(record.params),
            reason=record.reason, message=record.message, iteration=iteration, history=history,
            history_stride=stride, last_metrics=last_metrics, checkpoint=record.checkpoint,
            checkpoint_iteration=(record.checkpoint_iteration if record.checkpoint_iteration is not None
                                  else iteration if record.checkpoint else 0),
            attempt=record.attempt, failures=record.failures, parent=record.parent,
            failure_log=[dict(entry) for entry in record.failure_log],
            lineage=[dict(entry) for entry in record.lineage],
            attempt_start=record.attempt_start, queue_wait_s=record.queue_wait_s, queue_waits=record.queue_waits,
            evictions=record.evictions,
            last_seq=record.last_result_seq if record.last_result_seq is not None else len(history) - 1)
        trial.launched = record.phase not in (PENDING, QUEUED) or record.attempt > 0 or bool(history)
        trial.relaunch = record.phase is PAUSED and not self.spec.suspend
        # the persisted values outlive a downsampled history
        trial.latest.update(record_latest(record, self.searcher.tracked_metrics))
        if record.last_value is not None or record.best_value is not None:
            trial.last_value = record.last_value
            if is_finite(record.best_value):
                self._record_value(trial, record.best_value, record.best_iteration or iteration)
        else:   # a Trial written before the bounded status: from its history
            metric = self.spec.objective.metric
            for position, metrics in enumerate(history, start=1):
                value = objective_value(metrics, metric)
                if value is not None:
                    trial.last_value = value
                    self._record_value(trial, value, metrics.get("iteration", position))
        if trial.phase is SUCCEEDED:
            self._judge_constraints(trial)
        return trial


# Cluster faults are retried without limit (preemptible nodes, a cluster head restarting), so
# the Trial keeps only the latest of them; every counted failure stays (maxFailures bounds
# them), since a restarted operator counts them again from the Trial.
KEPT_CLUSTER_FAULTS = 10
# failure_log reasons that do not count against maxFailures (a restarted operator reads
# the Trial's list): the cluster's doing, and the queue's evictions
NOT_COUNTED = frozenset({"ClusterFault", admission.PREEMPTED, admission.EVICTED})


def _forget_old_cluster_faults(failure_log: list[dict[str, Any]]) -> None:
    faults = [i for i, entry in enumerate(failure_log) if entry["reason"] in NOT_COUNTED]
    for index in reversed(faults[:-KEPT_CLUSTER_FAULTS]):
        del failure_log[index]
