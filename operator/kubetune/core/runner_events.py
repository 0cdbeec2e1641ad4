"""The runner's answers to what happens to a trial: its results, its end, its failure
(retried from its checkpoint), a pause (a PBT exploit continues from another trial's
checkpoint) and, with a queue (spec.queue), its admission.  ``TrialEvents`` is a part
of ``TrialRunner`` (runner.py) and works on its state; pure."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from kubetune.core import admission, budget as budgets
from kubetune.core.curve import add_point
from kubetune.core.failures import OBJECTIVE_NOT_A_NUMBER, wrong_type
from kubetune.core.schedulers import CONTINUE, Action, SchedulerDecision
from kubetune.core.search_values import latest_values, objective_value
from kubetune.core.trial import KEPT_LINEAGE, TrialInfo
from kubetune.core.types import Decision, PauseTrial, Result, TrialPhase, TrialPhaseChanged
from kubetune.core.values import is_finite, judged

RUNNING, PAUSED, PENDING = TrialPhase.RUNNING, TrialPhase.PAUSED, TrialPhase.PENDING
SUCCEEDED, FAILED, STOPPED = TrialPhase.SUCCEEDED, TrialPhase.FAILED, TrialPhase.STOPPED


class TrialEvents:
    # ------------------------------------------------------------------ admission (spec.queue)

    def awaiting_admission(self) -> list[str]:
        return sorted(self._admissions.awaiting)

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
            self._admissions.still_waiting(name, queue_full)
            return []
        admitted = self._admissions.admit(name, self._counts[RUNNING])
        if admitted is None:
            return []
        # admitted before the restart or while the operator was down (``restored``): its
        # queue wait is unknown (not counted) and its run started when recorded, but it
        # still goes through the parallelism check (the queue may have admitted window
        # trials meanwhile)
        admitted_before, restored = admitted
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

    # ------------------------------------------------------------------ trial events

    def on_trial_usage(self, name: str, attempt: int | None, started: float | None, seen: float | None,
                       ended: bool = False) -> bool:
        """What the trial's host said about an attempt: when it started, the latest time
        it saw, whether it ended (its own clock, core/usage.py).  True if the ledger changed."""
        trial = self._trials.get(name)
        if trial is None or attempt is None:
            return False
        resources = self.spec.trial.resources
        return trial.usage.observe(attempt, started, seen, gpus=resources.gpu * resources.bundles,
                                   cpus=resources.cpu * resources.bundles, ended=ended)

    def on_trial_launched(self, name: str, now: float, *, started_now: bool = False) -> list[Decision]:
        """``started_now``: its launch went out only now (the platform deferred it), so its
        run starts now for spec.trial.timeout, not when the launch was decided."""
        trial = self._trials.get(name)
        if trial is not None and trial.start_time is None:
            trial.start_time = now
        if trial is not None and started_now and trial.phase is RUNNING:
            trial.attempt_start = now
        if trial is not None:
            trial.launch_deferred = False
        return []

    def on_launch_deferred(self, name: str) -> None:
        """The platform deferred the launch (``LaunchDeferred``): nothing of it runs yet, and
        the wait (up to the silent-actor bound, 10 min) is not the run spec.trial.timeout
        counts.  The run's clock starts when the launch goes out (``on_trial_launched``).
        A flag, not a moved ``attempt_start``: that rewrote the Trial at every retry and,
        with retries backing off to 30 s, still timed out trials under a 30 s timeout."""
        trial = self._trials.get(name)
        if trial is not None and trial.phase is RUNNING:
            trial.launch_deferred = True

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
        self._bests.record_value(trial, value, iteration)
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
        trial.usage.saw(result.attempt, result.timestamp)
        metrics = {**result.metrics, "iteration": result.iteration}
        trial.history, trial.history_stride = add_point(trial.history, trial.history_stride, metrics)
        trial.last_metrics = metrics
        if result.checkpoint:
            trial.checkpoint, trial.checkpoint_iteration = result.checkpoint, result.iteration
        value = self._record_objective(trial, result.metrics, result.iteration)
        objective = self.spec.objective
        if is_finite(value) and not self.spec.multi_objective and self._bests.feasible(trial.latest) \
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
        if decision.action is Action.CONTINUE and budgets.limited(self.spec):
            spent = budgets.exhausted(self.spec, self._trials.values())
            if spent and budgets.stops_now(self.spec, self.scheduler.at_rung(result.iteration), result.iteration):
                return self._end(trial, STOPPED, budgets.BUDGET_EXHAUSTED, spent, now) + self._check_finished(now)
        if decision.action is Action.STOP:
            return self._end(trial, STOPPED, decision.reason, decision.message, now) + self._check_finished(now)
        if decision.action is Action.PAUSE:
            return self._pause(trial, decision, now)
        return []

    def _pause(self, trial: TrialInfo, decision: SchedulerDecision, now: float) -> list[Decision]:
        self._set_phase(trial, PAUSED)
        trial.reason, trial.message = decision.reason, decision.message
        donor = self._trials.get(decision.clone_from) if decision.clone_from else None
        decisions: list[Decision] = [PauseTrial(trial.name, decision.reason, decision.message,
                                                clone_from=donor.name if donor is not None else None)]
        if donor is None:
            self._release(trial, now)
            return decisions
        # PBT exploit: continue from the donor's checkpoint with explored parameters.
        trial.params = dict(decision.new_params or donor.params)
        trial.parent = donor.name
        trial.checkpoint, trial.checkpoint_iteration = donor.checkpoint, donor.checkpoint_iteration
        trial.lineage.append({"iteration": donor.checkpoint_iteration, "from": donor.name,
                              "params": dict(trial.params)})
        del trial.lineage[:-KEPT_LINEAGE]
        trial.relaunch = True
        self._release(trial, now)       # (after relaunch: the room it keeps is for its own relaunch)
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
        self._release(trial, None)     # its worker may be gone: no room kept to start warm in
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
