"""The status writer: renders the Trials' and the Experiment's status from the runner,
and writes what changed, coalesced (controller/coalesce.py): a phase change at once,
metrics at most every TRIAL_METRICS_WRITE_INTERVAL per Trial, the summary at most
every EXPERIMENT_WRITE_INTERVAL, and a change of its usage alone at most every
EXPERIMENT_USAGE_WRITE_INTERVAL.  A write the API refuses is retried with backoff and
surfaced (write_failures.py), never raised: the other objects are written meanwhile.
A Trial whose terminal status is written then loses its managedFields (managed_fields.py)."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from kubetune import metrics
from kubetune.controller import render
from kubetune.controller.plan_status import PlanStatus
from kubetune.controller.usage_metrics import UsageCounters
from kubetune.controller.coalesce import WriteCoalescer, differs_beyond
from kubetune.controller.context import ExperimentContext, log
from kubetune.controller.managed_fields import ManagedFieldsStrip
from kubetune.controller.merge_patch import merge_patch
from kubetune.controller.outcomes_status import warm_start_condition
from kubetune.controller.platform_queue import PlatformQueue
from kubetune.controller.status_events import status_events
from kubetune.controller.write_failures import WriteFailures
from kubetune.core.types import ExperimentSummary, TrialPhase
from kubetune.k8s.errors import WriteRefused

TRIAL_METRICS_WRITE_INTERVAL = 2.0      # seconds between metric-only writes of one Trial
TRIAL_START_WRITE_DELAY = 1.0           # a trial's Running is written this late: short trials get one write
EXPERIMENT_WRITE_INTERVAL = 1.0         # seconds between summary writes of the Experiment
# status.usage grows with every result: a change of it alone waits this long (it goes out
# with any other change; the live figures are the kubetune_*_seconds_total counters)
EXPERIMENT_USAGE_WRITE_INTERVAL = 30.0
FINISH_WAITS_FOR_TRIALS_S = 30.0
VOLATILE_EXPERIMENT_FIELDS = ("usage",)


class StatusWriter:
    def __init__(self, ctx: ExperimentContext, uncreated: Callable[[], set[str]], dashboard: str | None = None) -> None:
        self.ctx = ctx
        self._uncreated = uncreated     # trials whose Trial resource is not created yet (effects.py)
        # a Trial status written: the results store takes the trial's state (result_pump.py)
        self.trial_written: Callable[[str], None] = lambda name: None
        self.trial_writes = WriteCoalescer(TRIAL_METRICS_WRITE_INTERVAL, start_phase=TrialPhase.RUNNING.value,
                                           start_delay=TRIAL_START_WRITE_DELAY)
        self.written: dict[str, Any] = {}     # the Experiment status as last written (or restored)
        self._written_at = float("-inf")
        self._phase_key: tuple | None = None     # what decided the phase last written (_phase_key)
        self.failures = WriteFailures()
        self.platform_queue = PlatformQueue()   # launched trials the platform has not started yet
        self.spec_problem: tuple[str, str] | None = None   # (reason, message) shown as a condition
        self.blocked: tuple[str, str] | None = None   # (reason, message): e.g. a missing permission
        self.warm_sources: list[dict[str, Any]] | None = None   # status.warmStartSources (warm_start.py)
        self._scheduler_warned = False
        self._finished_at: float | None = None   # when the finished status first waited for Trial writes
        self._dashboard = dashboard              # status.dashboard, when the chart serves one
        self._plan = PlanStatus(ctx.name)        # status.plan while suspended (plan_status.py)
        self._usage_counters = UsageCounters(ctx.namespace, ctx.name)   # kubetune_gpu_seconds_total, ...
        self.fields_strip = ManagedFieldsStrip()  # finished Trials' managedFields (managed_fields.py)

    async def flush(self, *, force: bool = False) -> None:
        """Write what changed: phases at once, metrics and the summary coalesced."""
        ctx = self.ctx
        if ctx.runner is None:
            return
        now = ctx.clock()
        waiting = set()
        uncreated = self._uncreated()
        for name in ctx.touched:
            trial = ctx.runner.trials.get(name)
            if trial is None:
                continue
            if name in uncreated:
                waiting.add(name)
                continue
            # a change that keeps the phase is not written before the interval: render it
            # then (rendering a bounded status still costs more than a result)
            phase = self.platform_queue.trial_status(name, {"phase": trial.phase.value})["phase"]
            if not force and self.trial_writes.can_wait(name, phase, now):
                waiting.add(name)
                continue
            self.trial_writes.want(name, self.trial_status(name))
        ctx.touched = waiting
        for name, status in self.trial_writes.due(now, force=force):
            if not self.failures.ready(f"Trial {name}", now):
                continue       # backing off; the other Trials are written meanwhile
            patch = merge_patch(self.trial_writes.last_written(name), status)
            if await self.write(f"Trial {name}", ctx.store.patch_trial_status(name, patch)):
                self.trial_writes.written(name, status, now)
                self.fields_strip.finished(name, status)
                self.trial_written(name)
        if self.fields_strip:
            await self._strip_finished(now)
        await self._flush_experiment(now, force=force)

    async def _strip_finished(self, now: float) -> None:
        """The managedFields of the Trials whose terminal status is written, a few at a
        time, at once; a refusal is logged and retried later, never surfaced on the status."""
        ctx = self.ctx

        async def strip(name: str) -> None:
            try:
                await ctx.store.strip_managed_fields(name)
            except WriteRefused as error:      # the trial's status is written already: only logged
                if not error.transient:        # 403 (no patch on trials), 422: not for any Trial
                    if self.fields_strip.refuse(str(error)):
                        log.warning("%s/%s: finished Trials' managedFields are not stripped: %s",
                                    ctx.namespace, ctx.name, error)
                    return
                gave_up = self.fields_strip.failed(name, now)
                log.info("%s/%s: Trial %s: managedFields not stripped%s: %s", ctx.namespace, ctx.name, name,
                         " (given up)" if gave_up else "; tried again later", error)
            else:
                self.fields_strip.stripped(name)
        await asyncio.gather(*(strip(name) for name in self.fields_strip.due(now)))

    async def write(self, key: str, write: Any) -> bool:
        """Await one write; a refusal is recorded for backoff and surfaced, never raised."""
        ctx = self.ctx
        try:
            await write
        except WriteRefused as error:
            metrics.status_write_failed(key.split(" ", 1)[0].lower() + "s", error.reason)
            log.warning("%s/%s: %s: status write refused: %s", ctx.namespace, ctx.name, key, error)
            if self.failures.failed(key, error, ctx.clock()):
                await ctx.event("Warning", "StatusWriteFailed", self.failures.condition()[1])
            return False
        self.failures.succeeded(key)
        return True

    async def write_experiment(self, status: Mapping[str, Any]) -> bool:
        """One Experiment status write; once it is in, its phase goes to the results store."""
        if not await self.write("Experiment", self.ctx.store.patch_experiment_status(status)):
            return False
        if self.ctx.results is not None:
            self.ctx.results.experiment_status(status)
        return True

    def _was_shown(self, condition: str) -> bool:
        return any(c.get("type") == condition for c in self.written.get("conditions") or [])

    async def _extra_conditions(self, runner_summary: ExperimentSummary) -> list[tuple]:
        """The conditions beside Running/Succeeded/Failed: the platform's, the results
        store's, the scheduler's, warm start, refused writes, a refused spec edit."""
        ctx, extra = self.ctx, []
        if ctx.platform is not None:
            unavailable, condition = bool(ctx.platform.last_error), ctx.platform.unavailable_condition
            if unavailable or self._was_shown(condition):
                extra.append((condition, unavailable, "ConnectionFailed" if unavailable else "Connected",
                              ctx.platform.last_error))
        if ctx.results is not None:
            extra += ctx.results.conditions(c.get("type") for c in self.written.get("conditions") or [])
        warning = ctx.runner.scheduler.warning()
        if warning:   # e.g. PBT whose function never checkpoints: it can never exploit
            extra.append(("SchedulerWarning", True, "SchedulerCannotAct", warning))
            if not self._scheduler_warned:   # the Event once; the condition keeps the count
                self._scheduler_warned = True
                await ctx.event("Warning", "SchedulerCannotAct", warning)
        extra += warm_start_condition(runner_summary.outcomes, ctx.spec.warm_start is not None)
        if ctx.spec.search.auto:   # search.algorithm: auto, and what it stands for
            extra.append(("SearchChosen", True, "Auto", f"search.algorithm auto chose {ctx.spec.search.auto}"))
        failed_writes = self.failures.condition()
        if failed_writes is not None:
            extra.append(("StatusWriteFailed", True, *failed_writes))
        elif self._was_shown("StatusWriteFailed"):
            extra.append(("StatusWriteFailed", False, "StatusWritten", ""))
        if self.spec_problem is not None:
            extra.append(("SpecRejected", True, *self.spec_problem))
        elif self._was_shown("SpecRejected"):
            extra.append(("SpecRejected", False, "SpecAccepted", ""))
        return extra

    def _kept_status(self) -> dict[str, Any] | None:
        ctx = self.ctx
        kept: dict[str, Any] = {}
        if self.warm_sources is not None:
            kept["warmStartSources"] = self.warm_sources
        if ctx.spec.suspend:   # the plan to review before launch (issue 27)
            ledger = ctx.platform.ledger if ctx.platform is not None else None
            kept["plan"] = self._plan.get(ctx.spec, ctx.generation, ledger)
        return kept or None

    def _phase_inputs(self) -> tuple:
        """What render's phase machine decides the phase from: blocked, finished (and how),
        suspended; else Running."""
        finished = self.ctx.runner.finished
        return (self.blocked is not None, finished and finished.phase, bool(self.ctx.spec.suspend))

    async def _flush_experiment(self, now: float, *, force: bool) -> None:
        ctx = self.ctx
        phase_inputs = self._phase_inputs()
        if not force and phase_inputs == self._phase_key and now - self._written_at < EXPERIMENT_WRITE_INTERVAL:
            # only a new phase goes out before the interval, and its inputs did not change:
            # no need to render (200 Experiments cycling spent a third of the operator here)
            return
        runner_summary = ctx.runner.summary(now)
        self._usage_counters.export(runner_summary.usage)
        extra = await self._extra_conditions(runner_summary)
        summary = self.platform_queue.summary(runner_summary, ctx.runner.trials)
        status = render.experiment_status(
            summary, total=ctx.runner.spec.budget.max_trials, previous=self.written,
            generation=ctx.generation, now=now, suspended=ctx.spec.suspend, extra_conditions=extra,
            blocked=self.blocked,
            kept=self._kept_status())
        if self._dashboard is not None:
            status["dashboard"] = self._dashboard
        if status == self.written:
            self._phase_key = phase_inputs
            return
        phase_changed = status.get("phase") != self.written.get("phase")
        if not (force or phase_changed or now - self._written_at >= EXPERIMENT_WRITE_INTERVAL):
            return
        if (not force and now - self._written_at < EXPERIMENT_USAGE_WRITE_INTERVAL
                and not differs_beyond(self.written, status, VOLATILE_EXPERIMENT_FIELDS)):
            return
        if not self.failures.ready("Experiment", now):
            return
        if summary.finished is not None and (self._uncreated() or any(
                not self.failures.hopeless(f"Trial {name}") for name in self.trial_writes.pending)):
            # Succeeded/Failed goes out after the Trials' final statuses (retried if the
            # API refused them), so `kubectl wait` never returns ahead of them; a Trial
            # write that retrying cannot cure (422, 403) does not hold it, nor anything
            # for longer than FINISH_WAITS_FOR_TRIALS_S. A transient refusal does: three
            # in a row (surfaced as StatusWriteFailed) let Succeeded out ahead of a Trial
            # still shown Running (test_effects, with every third write refused)
            self._finished_at = self._finished_at if self._finished_at is not None else now
            if now - self._finished_at < FINISH_WAITS_FOR_TRIALS_S:
                return
        patch = merge_patch(self.written, status)
        if not await self.write_experiment(patch):
            return
        for kind, reason, message in status_events(self.written, status):
            await ctx.event(kind, reason, message)
        self.written = status
        self._written_at = now
        self._phase_key = phase_inputs

    def trial_status(self, name: str) -> dict[str, Any]:
        ctx = self.ctx
        trial = ctx.runner.trials[name]
        return self.platform_queue.trial_status(name, render.trial_status(
            trial, objective=ctx.spec.objective.metric, decision_state=ctx.runner.decision_state(name)))

    async def persist_trial(self, name: str) -> None:
        """Write a trial's status now, ahead of the side effect that follows (record intent
        first): an operator killed in between restarts from what it was about to do."""
        ctx = self.ctx
        trial = ctx.runner.trials.get(name)
        if trial is None or name in self._uncreated():
            return
        status = self.trial_status(name)
        patch = merge_patch(self.trial_writes.last_written(name), status)
        if await self.write(f"Trial {name}", ctx.store.patch_trial_status(name, patch)):
            self.trial_writes.written(name, status, ctx.clock())
            self.fields_strip.finished(name, status)
            self.trial_written(name)
        else:   # the effect goes ahead (a stop frees its slot); the status is retried
            self.trial_writes.want(name, status)

    def note_waiting(self, name: str, reason: str, message: str) -> None:
        """What the platform says a running trial waits for ("" : nothing), shown as Queued;
        the platform words it (a trial queued again after an eviction says Preempted)."""
        ctx = self.ctx
        trial = ctx.runner.trials.get(name)
        if trial is None:
            return
        since_eviction = trial.evictions > 0 and trial.admitted_attempt != trial.attempt
        if self.platform_queue.note(name, *ctx.platform.shown_waiting(reason, message, trial.evictions,
                                                                      since_eviction)):
            ctx.touched.add(name)

    def seed(self, trials: list[Mapping[str, Any]], status: Mapping[str, Any]) -> None:
        """After a restart: what is persisted is not rewritten; its first change goes out
        at once, not an interval after the restart (after a failover the Trials show
        progress again as soon as the new leader has any: the old leader's last write is
        of unknown age)."""
        for trial in trials:
            self.trial_writes.seed(trial["metadata"]["name"], trial.get("status") or {}, float("-inf"))
        self.fields_strip.restored(trials)
        self.written = dict(status)

    async def fail_invalid_spec(self, message: str, generation: int | None, *,
                                reason: str = "InvalidSpec") -> None:
        ctx = self.ctx
        now = ctx.clock()
        previous = self.written
        status = render.refused_status(previous, reason, message, now=now, generation=generation)
        if await self.write_experiment(status):
            self.written = {**previous, **status}
        await ctx.event("Warning", reason, message)
