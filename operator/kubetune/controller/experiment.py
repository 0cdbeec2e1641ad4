"""ExperimentController: drives one Experiment's TrialRunner against its platform and
persists what happens through a Store.

The runner (core/) decides; the controller's parts carry the decisions out (the
Trial resource is created before anything is launched for it), feed results and
terminations back, and write status coalesced.  This class only coordinates them,
one reconcile cycle at a time:

- ``SpecIntake`` (intake.py): a new spec generation: parse, validate, restore, warm start;
- ``EffectQueue`` (effects.py): the runner's decisions, carried out and retried;
  with ``RunReconciler`` (runs.py) and ``CheckpointKeeper`` (checkpoints.py);
- ``ResultPump`` (result_pump.py): platform -> runner -> results store;
- ``StatusWriter`` (status_writer.py): render, coalesce, write.

They share an ``ExperimentContext`` (context.py): the spec, the runner, the platform."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Mapping

from kubetune import metrics
from kubetune.controller.checkpoints import CheckpointKeeper
from kubetune.controller.context import ExperimentContext, log
from kubetune.controller.effects import EffectQueue
from kubetune.controller.intake import SpecIntake
from kubetune.controller.result_pump import ResultPump
from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.controller.runs import RunReconciler
from kubetune.controller.status_writer import StatusWriter
from kubetune.controller.store import Store
from kubetune.controller.write_failures import backoff
from kubetune.core.runner import TrialRunner
from kubetune.executors.platform import Platform, PlatformRegistry
from kubetune.results.study_meta import experiment_link
from kubetune.core.sanitize import cap_text
from kubetune.k8s.errors import forbidden
from kubetune.spec import ExperimentSpec

IDLE_POLL_SECONDS = 0.25                # longest pause between polls of running trials


def forbidden_message(error: Exception) -> str | None:
    """A 403 as the Experiment shows it: the API's own words (k8s.errors.forbidden), and
    what to do; None for any other error."""
    text = forbidden(error)
    if text is None:
        return None
    return cap_text(f"missing permission: {text}; grant it to the operator's ServiceAccount "
                    "(charts/kubetune RBAC values)")


class ExperimentController:
    def __init__(self, *, namespace: str, name: str, store: Store, registry: PlatformRegistry,
                 body: Callable[[], Mapping[str, Any]], clock: Callable[[], float] = time.time,
                 checkpoint_storage: str = "", on_cycle: Callable[["ExperimentController"], None] | None = None,
                 results: ResultsRecorder | None = None, dashboard_url: str = "") -> None:
        self.namespace = namespace
        self.name = name
        self.ctx = ExperimentContext(
            namespace=namespace, name=name, registry=registry, body=body, clock=clock,
            store=store,
            default_storage=checkpoint_storage, results=results)
        self.runs = RunReconciler(self.ctx)
        self.checkpoints = CheckpointKeeper(self.ctx)
        self.effects = EffectQueue(self.ctx, self.runs, self.checkpoints)
        self.status = StatusWriter(self.ctx, self.effects.uncreated,
                                   # status.dashboard: this Experiment's page in the chart's dashboard
                                   dashboard=experiment_link(dashboard_url, namespace, name) if dashboard_url else None)
        self.pump = ResultPump(self.ctx, self.effects, self.status)
        self.effects.status, self.effects.pump = self.status, self.pump
        self.status.trial_written = self.pump.record_trial
        self.intake = SpecIntake(self.ctx, self.status, self.effects, self.pump, self.checkpoints)
        self._on_cycle = on_cycle
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._in_cycle = False

    # what the operator, `kubetune run` and the metrics read
    @property
    def spec(self) -> ExperimentSpec | None:
        return self.ctx.spec

    @property
    def runner(self) -> TrialRunner | None:
        return self.ctx.runner

    @property
    def platform(self) -> Platform | None:
        return self.ctx.platform

    @property
    def store(self) -> Store:
        return self.ctx.store

    @property
    def results(self) -> ResultsRecorder | None:
        return self.ctx.results

    @property
    def written_status(self) -> Mapping[str, Any]:
        """The Experiment status as last written (or restored); read by kubetune.metrics."""
        return self.status.written

    # ------------------------------------------------------------------ lifecycle

    def wake(self) -> None:
        """Something changed (spec edit, deletion): run a cycle now."""
        self._wakeup.set()

    async def run(self, stopped: Callable[[], bool], first_cycle_done: Callable[[], None] | None = None) -> None:
        """The reconcile loop; returns when ``stopped()`` turns true.  It never raises:
        a cycle that fails is logged, surfaced on the Experiment and retried with
        backoff (kopf would restart a raising daemon every 60 s with the same state).
        ``first_cycle_done`` is called once, when its first cycle ended, whatever it did."""
        idle = 0.01
        failures = 0
        while not stopped() and not self._stopping:
            # cleared before the cycle, not after: a wake during a cycle (the ledger saying
            # this Experiment's trial is first in line) runs the next cycle at once
            self._wakeup.clear()
            try:
                self._in_cycle = True
                busy = await self.reconcile_once()
                failures = 0
                if self.status.blocked is not None:
                    self.status.blocked = None
                    await self._flush_guarded()
            except Exception as error:  # noqa: BLE001 - see the docstring
                failures += 1
                busy = False
                await self._cycle_failed(error, failures)
                idle = backoff(failures)
            else:
                idle = 0.01 if busy else min(idle * 2, IDLE_POLL_SECONDS if self._has_active() else 2.0)
            self._in_cycle = False
            if first_cycle_done is not None:
                first_cycle_done()
                first_cycle_done = None
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=idle)
            except asyncio.TimeoutError:
                pass
        await self._flush_guarded(force=True)

    async def _flush_guarded(self, *, force: bool = False) -> None:
        try:
            await self.status.flush(force=force)
        except Exception as error:  # noqa: BLE001 - logged; the loop goes on or is ending
            log.warning("%s/%s: status not written: %s", self.namespace, self.name, error)

    async def _cycle_failed(self, error: Exception, failures: int) -> None:
        """A reconcile cycle raised.  A missing permission (403) is a Failed condition
        naming it; anything else a Warning Event the first time; both are retried."""
        metrics.reconcile_error(type(error).__name__)
        if failures == 1:
            log.exception("%s/%s: reconcile failed; retrying with backoff", self.namespace, self.name)
        message = forbidden_message(error)
        if message is not None:
            if self.status.blocked != ("Forbidden", message):
                self.status.blocked = ("Forbidden", message)
                if self.ctx.runner is None:     # nothing rendered yet: the condition alone
                    generation = self.ctx.body().get("metadata", {}).get("generation")
                    await self.status.fail_invalid_spec(message, generation, reason="Forbidden")
                else:
                    await self.ctx.event("Warning", "Forbidden", message)
            await self._flush_guarded()
        elif failures == 1:
            await self.ctx.event("Warning", "ReconcileError", f"{type(error).__name__}: {error}")

    def stop(self) -> None:
        """End the loop (its trials keep running)."""
        self._stopping = True
        self._unwatch()
        self._withdraw_queued()
        self.wake()

    def _withdraw_queued(self) -> None:
        """Its queued trials will not be tried: out of the shared ledger's line now, not once
        a deletion's cleanup is done (which waits for every run to end); and its runner
        launches and queues nothing more (TrialRunner.close)."""
        if self.ctx.runner is not None:
            self.ctx.runner.close()

    def _unwatch(self) -> None:
        if self.ctx.platform is not None:
            self.ctx.platform.ledger.unwatch(self.ctx.prefix)

    async def release_resources(self) -> None:
        """The Experiment is gone and its trials ended (controller.operator_state): give
        back what they held on its platform, and the demand they stood for."""
        self.stop()
        if self.ctx.platform is None:
            return
        runner = self.ctx.runner
        names = list(runner.active_trials()) if runner is not None else []
        await self.ctx.platform.release([self.ctx.trial_key(name) for name in names])

    def _has_active(self) -> bool:
        return self.ctx.runner is not None and bool(self.ctx.runner.active_trials())

    @property
    def stopped_by_request(self) -> bool:
        """``stop()`` was called (the Experiment is deleted or re-created)."""
        return self._stopping

    def at_rest(self) -> bool:
        """Finished for its current spec, with nothing left to end, store or write: the
        operator lets this controller (its runner, every trial's state) go, and builds a
        new one, restored from the Trials, when the spec changes (operator_state.serve).
        A finished Experiment then costs no memory beyond its status' counts."""
        ctx, written = self.ctx, self.status.written
        final = (written.get("phase") in ("Succeeded", "Failed")
                 and written.get("observedGeneration") == ctx.generation is not None)
        if not final or self._in_cycle or self.status.blocked is not None:
            return False
        if ctx.results is not None and ctx.results.writer.problem:
            return False    # its ResultsStoreUnavailable must still be seen to clear
        if ctx.runner is None:
            return self.intake.finished_at_start and self.runs.orphans_checked
        return (ctx.runner.finished is not None and not ctx.runner.active_trials() and self.runs.orphans_checked
                and not self.pump.unstored and not self.runs.to_end and not self.effects
                and not self.checkpoints.to_delete and not ctx.touched and not self.status.trial_writes.pending
                and not self.status.fields_strip)

    def needs_connection(self) -> str | None:
        """The platform address whose connection this controller needs now, or None: its
        platform keeps its connection anyway, or it has finished with nothing left to do
        there (``_done_with_platform``).  Read by the operator to end the connections (driver
        processes) nobody needs (PlatformRegistry.retire_idle)."""
        platform = self.ctx.platform
        if platform is None or not platform.idle_connection_ends or self._stopping:
            return None
        if self._in_cycle:
            return platform.address
        if self.ctx.runner is None:     # finished before a restart, or a spec that never ran
            return platform.address if self.intake.finished_at_start and not self.runs.orphans_checked else None
        return None if self._done_with_platform() else platform.address

    def _done_with_platform(self) -> bool:
        """Finished, nothing of it runs on its platform (its runs were ended), nothing
        owed: its cycles make no platform call until a spec change reopens it (only for a
        platform whose idle connection ends)."""
        runner, platform = self.ctx.runner, self.ctx.platform
        return (platform is not None and platform.idle_connection_ends and runner is not None
                and runner.finished is not None and not runner.active_trials() and self.runs.orphans_checked
                and not self.pump.unstored and not self.runs.to_end and not self.effects)

    # ------------------------------------------------------------------ one cycle

    async def reconcile_once(self) -> bool:
        """One pass: spec changes, launches, results. True if anything happened."""
        ctx = self.ctx
        body = ctx.body()
        generation = body.get("metadata", {}).get("generation")
        if generation != ctx.generation:
            await self.intake.take(body, generation)
        if ctx.runner is None:
            if self.intake.finished_at_start and not self.runs.orphans_checked:
                await self.runs.end_runs_of_finished()
            await self.status.flush()
            return False
        if ctx.runner.finished is not None and not ctx.runner.active_trials() and not self.runs.orphans_checked:
            await self.runs.end_runs_of_finished()     # e.g. restored finished after a spec change
        if self._done_with_platform():
            self._unwatch()
            # no platform call: an idle connection may end (its driver process)
            if self.checkpoints.to_delete:
                await self.checkpoints.delete_ended()
            await self.status.flush()
            return False
        if not await ctx.platform.ensure_connected():
            await self.status.flush()
            return False
        # woken when a trial of ours is first in line and fits, not only at the next cycle
        ctx.platform.ledger.watch(ctx.prefix, self.wake)
        try:
            busy = await self._step_and_poll()
        finally:
            # its first step asked for what it wants: no room is kept for it any more
            # (not at ``watch``: a burst's Experiments all pass it before any steps)
            ctx.platform.ledger.started(ctx.prefix)
            # a room kept for a launch the cycle did not reach (it failed) goes back to the line
            if ctx.runner is not None:
                ctx.runner.rooms.let_go()
        if self.checkpoints.to_delete:
            await self.checkpoints.delete_ended()
        await self.status.flush()
        if self._on_cycle is not None:
            self._on_cycle(self)
        return busy

    async def _step_and_poll(self) -> bool:
        """The runner's decisions carried out, and the running trials polled; a platform
        call failing mid-cycle marks it unavailable (reconnect, keep the trials)."""
        ctx = self.ctx
        now = ctx.clock()
        busy = False
        try:
            await self.runs.reconcile(now)
            await ctx.platform.refresh_capacity()
            busy |= await self.effects.apply(ctx.runner.step(now))
            if self.pump.unstored:
                await self.pump.store_results_taken_before_restart()
            if await self.pump.poll_running():
                busy = True
                # fill the slots of trials that just ended now, not one cycle later (after a
                # stop() during the poll, the closed runner's step decides nothing: close())
                await self.effects.apply(ctx.runner.step(ctx.clock()))
        except Exception as error:
            if not ctx.platform_fault(error):
                raise
            metrics.reconcile_error(ctx.platform.unavailable_condition)
            ctx.platform.mark_unavailable(error)
        return busy

    async def flush(self, *, force: bool = False) -> None:
        """Write what changed (status_writer.py)."""
        await self.status.flush(force=force)
