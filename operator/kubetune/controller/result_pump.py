"""The result pump: what the platform says of the running trials goes to the runner,
and the results the runner took go to the results store.

Every poll asks for the results after each trial's last recorded sequence number
(idempotent: nothing is lost or counted twice).  The results store gets its rows here,
from the results the runner accepted, never from a rendered status: each ``Result``
becomes one row, handed to the writer's thread (results/writer.py), which does the
I/O; the ResultsRecorder lends the Trial's UID and takes the trial's other rows."""
from __future__ import annotations

import asyncio

from kubetune import metrics
from kubetune.controller.context import ExperimentContext, log
from kubetune.controller.effects import EffectQueue
from kubetune.controller.result_notes import ResultNotes
from kubetune.controller.status_writer import StatusWriter
from kubetune.core.failures import FailureKind
from kubetune.core.sanitize import cap_text
from kubetune.core.types import LaunchTrial, Result, TrialPhase
from kubetune.executors.base import LaunchDeferred, TrialState, TrialUpdate
from kubetune.results import Batch, ResultRow
from kubetune.spec.trial_key import TrialKey

# A poll waits this long for the first trial with news and leaves the other fetches in
# flight for the next one: a slow actor no longer holds up the cycle, and an actor is
# called about once per batch of results instead of once per cycle (issue 7 benchmarks)
POLL_WAIT_SECONDS = 0.05
# longest a trial's stop, pause or failure waits for the results store to take its results
RESULTS_SETTLE_SECONDS = 2.0


class ResultPump:
    def __init__(self, ctx: ExperimentContext, effects: EffectQueue, status: StatusWriter) -> None:
        self.ctx = ctx
        self.effects = effects
        self.status = status
        self.unstored: dict[str, int] = {}   # after a restart: trial -> last seq to check in the results store
        self._result_notes = ResultNotes(ctx.name)    # what the Trial's status cuts, said once per trial

    async def poll_running(self) -> bool:
        """One poll of the running trials; True if anything happened."""
        ctx = self.ctx
        pending = self.effects.pending()
        running = [name for name in ctx.runner.running_trials() if name not in pending]
        if not running:
            return False
        cursors = {ctx.trial_key(name): ctx.runner.trials[name].last_seq for name in running}
        updates = await ctx.platform.poll(cursors, wait_s=POLL_WAIT_SECONDS)
        now = ctx.clock()
        busy = False
        for key, update in updates.items():
            busy = await self._take(TrialKey.parse(key).trial, update, now) or busy
        return busy

    async def _take(self, name: str, update: TrialUpdate, now: float) -> bool:
        """One trial's update, to the runner; True if it brought news."""
        ctx = self.ctx
        trial = ctx.runner.trials[name]
        if update.attempt is not None and update.attempt < trial.attempt:
            # The actor still holds the attempt before: the operator recorded the retry and
            # was killed before it started it. Start it now (the old run ends first).
            try:
                await self.effects.launch(LaunchTrial(name, dict(trial.params), trial.checkpoint,
                                                      trial.checkpoint_iteration if trial.checkpoint else 0,
                                                      trial.attempt, trial.last_seq))
            except LaunchDeferred:
                pass    # the next poll finds the attempt before again, and tries again
            return True
        self.status.note_waiting(name, update.waiting_reason, update.waiting_message)
        # the ledger moves with results and the run's end, not with every poll: a Trial is
        # not rewritten only because time passed
        if ctx.runner.on_trial_usage(name, update.attempt, update.run_started, update.run_ended,
                                     ended=update.run_ended is not None):
            ctx.touched.add(name)
        if update.awaiting_admission or update.queue_wait_s is not None:   # before its end, if it ended
            waits = trial.queue_waits
            await self.effects.apply(ctx.runner.on_admission(name, update.awaiting_admission, now,
                                                             update.queue_wait_s, queue_full=update.queue_full))
            if trial.queue_waits != waits:
                ctx.touched.add(name)
        busy = False
        if update.results:
            busy = True
            metrics.results_processed(len(update.results))
            accepted = []
            for result in update.results:
                await self.effects.apply(ctx.runner.on_trial_result(name, result, now))
                if trial.last_seq == result.seq:
                    accepted.append(result)
            self.record_results(name, accepted)
            for reason, text in self._result_notes.notes(name, accepted, trial.history_stride):
                await ctx.trial_event(name, reason, text)   # once per trial: it was cut
        if update.state == TrialState.COMPLETED:
            busy = True
            await self.effects.apply(ctx.runner.on_trial_completed(name, now))
        elif update.state == TrialState.FAILED:
            busy = True
            await self.trial_errored(name, update.error or "trial failed", now)
        elif update.state == TrialState.MISSING:
            busy = True
            await self.trial_errored(name, update.error or ctx.platform.lost_run_message, now,
                                     cluster_fault=update.cluster_fault, evicted=update.evicted)
        if busy:
            ctx.touched.add(name)
        return busy

    def record_trial(self, name: str) -> None:
        """A trial's state to the results store, from the runner's view of it (called as
        its Trial status is written: the store follows the same coalescing)."""
        ctx = self.ctx
        trial = ctx.runner.trials.get(name) if ctx.runner is not None else None
        if ctx.results is None or trial is None:
            return
        shown = self.status.platform_queue.trial_status(name, {"phase": trial.phase.value, "reason": trial.reason})
        ctx.results.trial_state(name, phase=shown["phase"], reason=cap_text(shown.get("reason") or "", 256),
                                best=trial.best_value, iteration=trial.iteration, attempt=trial.attempt)
        ctx.results.usage(name, trial.usage.to_status(trial.queue_wait_s))

    def record_results(self, name: str, results: list[Result]) -> None:
        """The results the runner took (a result of a run it already stopped or paused is
        not the trial's): to the results store's writer, which only queues them."""
        recorder = self.ctx.results
        if recorder is not None and results:
            uid = recorder.uid(name)
            recorder.writer.submit(Batch(results=[ResultRow.of(uid, result) for result in results]))

    async def store_results_taken_before_restart(self) -> None:
        """After a restart: results the runner had taken (the Trial's lastResultSeq counts
        them) that the killed operator had not yet written to the results store are fetched
        again from the running trials, which keep a tail of fetched-past results
        (trainable/function_runner.py KEPT_ACKED_RESULTS), and stored; the runner never
        sees them twice."""
        ctx = self.ctx
        try:
            stored = await asyncio.to_thread(ctx.results.stored_through, list(self.unstored))
        except Exception as error:  # noqa: BLE001 - store down: the condition says so; nothing to refetch against
            log.warning("%s/%s: results store unreadable, not checking for results lost in the restart: %s",
                        ctx.namespace, ctx.name, error)
            self.unstored = {}
            return
        # a trial is checked off only once done: a fetch that fails (platform unreachable)
        # leaves it, and the ones after it, to the next cycle (the store is idempotent per seq)
        for name, last in list(self.unstored.items()):
            after, key = stored.get(name, -1), ctx.trial_key(name)
            while after < last:
                update = (await ctx.platform.poll({key: after}, wait_s=0)).get(key)
                missing = [r for r in (update.results if update is not None else ()) if after < r.seq <= last]
                if not missing:
                    break
                self.record_results(name, missing)
                after = missing[-1].seq
            del self.unstored[name]

    async def settle_results(self) -> None:
        """Before a trial's run ends (stop, pause, failure), and with it the only other copy
        of its results, let the results store take what it was handed: an operator killed
        after the Trial records the end must not lose them, since a restarted operator
        fetches missing results again only from runs still going.  Bounded; no wait at all
        while the store is failing (the Experiment's condition says so)."""
        if self.ctx.results is not None:
            await asyncio.to_thread(self.ctx.results.settle, RESULTS_SETTLE_SECONDS)

    async def trial_errored(self, name: str, error: str, now: float, *, cluster_fault: bool = False,
                            evicted: str = "") -> None:
        """A failed attempt: its whole error to the results store, then to the runner."""
        ctx = self.ctx
        trial = ctx.runner.trials.get(name)
        if ctx.results is not None and trial is not None and trial.phase is TrialPhase.RUNNING:
            kind = FailureKind.PLATFORM if cluster_fault else FailureKind.TRIAL
            ctx.results.failure(name, trial.attempt, evicted or kind.value, error, now)
            await self.settle_results()
        if evicted:
            await ctx.event("Normal", "TrialEvicted", f"{name}: {error}")
        await self.effects.apply(ctx.runner.on_trial_errored(name, error, now, cluster_fault=cluster_fault,
                                                             evicted=evicted))
