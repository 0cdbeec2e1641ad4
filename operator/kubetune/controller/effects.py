"""The effect queue: the runner's decisions, carried out on the platform and the API
server in order, each retried with backoff until it holds.

Effects are level-triggered (issue 15): each is idempotent (a Trial created twice is
the same Trial; a launch attaches to a run that exists; a stop of a stopped run does
nothing), so one that fails stays queued and is retried with backoff until it holds,
and the effects after it are not lost.  A trial's effects hold in order (its launch
waits for its Trial to exist).  No launch goes out while a run the runner stopped or
paused may still hold its slot (runs.py).  A launch the platform defers
(``LaunchDeferred``) is no failure: it stays queued, its trial shown Queued."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from kubetune.controller import render
from kubetune.controller.checkpoints import CheckpointKeeper
from kubetune.controller.context import ExperimentContext, log
from kubetune.controller.runs import RunReconciler
from kubetune.controller.status_writer import StatusWriter
from kubetune.controller.write_failures import SURFACE_AFTER, backoff
from kubetune.core.types import CreateTrial, FinishExperiment, LaunchTrial, PauseTrial, StopTrial, TrialPhase
from kubetune.executors.base import LaunchDeferred, LaunchRequest
from kubetune.k8s.errors import StaleTrial

if TYPE_CHECKING:
    from kubetune.controller.result_pump import ResultPump


@dataclasses.dataclass
class _Effect:
    """A decision to carry out, retried with backoff until it holds."""
    decision: Any
    attempts: int = 0
    retry_at: float = float("-inf")

    def failed(self, error: Exception, now: float) -> None:
        self.attempts += 1
        self.retry_at = now + backoff(self.attempts)

    @property
    def trial(self) -> str:
        """The trial it is about; "" for the Experiment's own (FinishExperiment)."""
        return "" if isinstance(self.decision, FinishExperiment) else self.decision.name


class EffectQueue:
    def __init__(self, ctx: ExperimentContext, runs: RunReconciler, checkpoints: CheckpointKeeper) -> None:
        self.ctx = ctx
        self.runs = runs
        self.checkpoints = checkpoints
        self.status: StatusWriter = None     # set by the controller: the parts refer to each other
        self.pump: ResultPump = None
        self._effects: list[_Effect] = []   # decisions not yet carried out (see apply)
        self._deferred: set[str] = set()    # trials whose launch the platform deferred (LaunchDeferred)
        self._applying = False

    def __bool__(self) -> bool:
        return bool(self._effects)

    async def apply(self, decisions: list) -> bool:
        """Queue the runner's decisions as effects and carry out what can be now."""
        self._effects.extend(_Effect(decision) for decision in decisions)
        if not self._applying:   # a nested call (a failed launch's retry) joins the loop below
            self._applying = True
            try:
                await self._carry_out_effects()
            finally:
                self._applying = False
        return bool(decisions)

    async def _carry_out_effects(self) -> None:
        ctx = self.ctx
        now = ctx.clock()
        waiting: set[str] = set()     # trials with an effect not yet held
        index = 0
        while index < len(self._effects):
            effect = self._effects[index]
            name = effect.trial
            launch = isinstance(effect.decision, LaunchTrial)
            if launch and self.runs.check_at == float("-inf") and name not in waiting:
                await self.runs.reconcile(now)     # a stop or pause went out: did it hold?
            held_back = name in waiting or now < effect.retry_at or launch and bool(self.runs.to_end)
            if not held_back:
                try:
                    await self._carry_out(effect.decision)
                except Exception as error:  # noqa: BLE001 - retried; see the module's docstring
                    effect.failed(error, now)
                    if launch and isinstance(error, LaunchDeferred):   # no failure: tried again, not surfaced
                        log.info("%s/%s: launch of %s deferred: %s", ctx.namespace, ctx.name, name, error)
                    else:
                        await self._failed(effect, error)
                else:
                    del self._effects[index]
                    continue
            if name:
                waiting.add(name)
            index += 1

    async def _failed(self, effect: _Effect, error: Exception) -> None:
        ctx = self.ctx
        if ctx.platform_fault(error):
            ctx.platform.mark_unavailable(error)
        log.warning("%s/%s: %s for %s failed (attempt %d, retrying): %s", ctx.namespace, ctx.name,
                    type(effect.decision).__name__, effect.trial, effect.attempts, error)
        if effect.attempts == SURFACE_AFTER and not isinstance(error, StaleTrial):
            await ctx.event("Warning", "EffectRetrying", f"{type(effect.decision).__name__} {effect.trial}: {error}")

    def uncreated(self) -> set[str]:
        """Trials whose Trial resource is not created yet: no status is written for them
        (the API would answer 404, and the status would count as written)."""
        return {effect.decision.name for effect in self._effects if isinstance(effect.decision, CreateTrial)}

    def pending(self) -> set[str]:
        """Trials with an effect still to hold: not polled meanwhile (a launch not yet out
        has no run to ask about)."""
        return {effect.trial for effect in self._effects}

    async def _carry_out(self, decision: Any) -> None:
        if not isinstance(decision, FinishExperiment):
            self.ctx.touched.add(decision.name)
        if isinstance(decision, CreateTrial):
            await self._create_trial(decision)
        elif isinstance(decision, LaunchTrial):
            checkpoint = self.checkpoints.launch_from(decision.name, decision.checkpoint)
            if checkpoint != decision.checkpoint:
                decision = dataclasses.replace(decision, checkpoint=checkpoint)   # decided before the copy
            await self.launch(decision)
        elif isinstance(decision, StopTrial):
            await self._stop(decision)
        elif isinstance(decision, PauseTrial):
            await self._pause(decision)
            if decision.clone_from:
                await self.checkpoints.clone(decision.name)
        elif isinstance(decision, FinishExperiment):
            kind = "Normal" if decision.phase == "Succeeded" else "Warning"
            await self.ctx.event(kind, decision.reason, decision.message)
            await self.runs.end_runs_of_finished()   # its pooled workers too: it holds nothing now
        # TrialPhaseChanged: written back with the trial's status

    async def _create_trial(self, decision: CreateTrial) -> None:
        ctx = self.ctx
        body = render.trial_body(namespace=ctx.namespace, experiment=ctx.body(), name=decision.name,
                                 index=decision.index, params=decision.params,
                                 resources=(ctx.body().get("spec", {}).get("trial", {}) or {}).get("resources", {}))
        created = await ctx.store.create_trial(body)
        if ctx.results is not None:    # its UID and parameters key the Trial's rows in the results store
            ctx.results.trial(created)

    def _request(self, decision: LaunchTrial) -> LaunchRequest:
        ctx, spec = self.ctx, self.ctx.spec
        return LaunchRequest(
            trial_key=ctx.trial_key(decision.name),
            entrypoint=spec.trial.entrypoint,
            config={**dict(spec.trial.config or {}), **dict(decision.params)},
            resources=spec.trial.resources,
            checkpoint=decision.checkpoint,
            start_iteration=decision.start_iteration,
            start_seq=decision.last_result_seq,
            attempt=decision.attempt,
            runtime_env=dict(spec.trial.runtime_env) if spec.trial.runtime_env else None,
            storage=ctx.storage(),
            keep_last=spec.checkpoint.keep_last,
            keep_best=spec.checkpoint.keep_best,
            metric=spec.objective.metric,
            mode=spec.objective.mode,
            pod_template=spec.trial.template,
            metrics_collector=spec.trial.metrics_collector,
            queue=spec.queue,
            priority_class=spec.priority_class,
        )

    async def launch(self, decision: LaunchTrial) -> None:
        ctx = self.ctx
        if ctx.runner.closed:     # the controller stopped mid-apply: nothing more starts; what
            return                # the trial holds is given back with the Experiment's others
        trial = ctx.runner.trials.get(decision.name)
        if decision.name in self._deferred and (trial is None or trial.phase is not TrialPhase.RUNNING
                                                or trial.attempt != decision.attempt):
            self._deferred.discard(decision.name)    # ended (or retried) while its launch waited
            return
        request = self._request(decision)
        waiting = ctx.platform.launch_waiting(request)
        if waiting is not None:
            self.status.note_waiting(decision.name, *waiting)
        now = ctx.clock()
        if decision.attempt > 0:
            # The new attempt, its start and the history cut back to its checkpoint are on
            # the Trial before it runs: a restarted operator resumes this attempt, not the last.
            await self.status.persist_trial(decision.name)
        try:
            await ctx.platform.start(request)
        except LaunchDeferred as deferred:     # the trial waits, Queued, and its launch stays queued
            self._deferred.add(decision.name)
            ctx.runner.on_launch_deferred(decision.name)
            self.status.note_waiting(decision.name, "LaunchDeferred", str(deferred))   # capped by LaunchDeferred
            raise
        except Exception as error:  # noqa: BLE001 - a failed launch is the trial's error, not ours
            cluster_fault = ctx.platform_fault(error)
            if cluster_fault:
                ctx.platform.mark_unavailable(error)
            await self.pump.trial_errored(decision.name, f"launch failed: {type(error).__name__}: {error}", now,
                                          cluster_fault=cluster_fault)
            return
        waited = decision.name in self._deferred
        if waited:     # it runs from now: spec.trial.timeout does not count the wait
            self._deferred.discard(decision.name)
            self.status.note_waiting(decision.name, "", "")
        ctx.runner.on_trial_launched(decision.name, now, started_now=waited)
        if decision.attempt == 0 and not decision.checkpoint:
            await ctx.event("Normal", "TrialLaunched", f"{decision.name} launched with {dict(decision.params)}")
        else:
            await ctx.event("Normal", "TrialRelaunched",
                            f"{decision.name} relaunched (attempt {decision.attempt}) from {decision.checkpoint or 'scratch'}")

    async def _pause(self, decision: PauseTrial) -> None:
        ctx = self.ctx
        await self.pump.settle_results()
        await self.status.persist_trial(decision.name)
        self.runs.check_soon()
        trial = ctx.runner.trials[decision.name]
        update = await ctx.platform.pause(ctx.trial_key(decision.name), after_seq=trial.last_seq)
        recorded = trial.last_seq
        await self._count_run_end(decision.name, update)
        if update is not None and update.results:
            # what it reported up to its pausing checkpoint: it resumes from there
            ctx.runner.on_trial_paused(decision.name, update.results)
            self.pump.record_results(decision.name, [r for r in update.results if recorded < r.seq <= trial.last_seq])
        if trial.last_seq != recorded:
            await self.status.persist_trial(decision.name)

    async def _count_run_end(self, name: str, update) -> None:
        """A stopped or paused run's end, as its host saw it: the usage ledger counts to
        there (core/usage.py), not to its last report.  Written now: the Trial's phase was
        written before the stop, and nothing else may touch it again."""
        if update is not None and self.ctx.runner.on_trial_usage(
                name, update.attempt, update.run_started, update.run_ended, ended=update.run_ended is not None):
            await self.status.persist_trial(name)

    async def _stop(self, decision: StopTrial) -> None:
        ctx = self.ctx
        await self.pump.settle_results()
        await self.status.persist_trial(decision.name)
        self.runs.check_soon()    # make sure it ended before the next launch
        await self._count_run_end(decision.name, await ctx.platform.stop(ctx.trial_key(decision.name)))
        if ctx.spec.checkpoint.delete_on_completion:
            self.checkpoints.to_delete[decision.name] = True
        if decision.phase is TrialPhase.FAILED:
            await ctx.event("Warning", "TrialFailed", f"{decision.name}: {decision.reason}: {decision.message}")
        elif decision.phase is TrialPhase.STOPPED:
            await ctx.event("Normal", decision.reason or "TrialStopped", f"{decision.name}: {decision.message}")
