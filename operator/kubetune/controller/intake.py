"""Spec intake: a new generation of the Experiment's spec is parsed and validated (the
scheduler's own checks, the platform's policy), and the first one taken chooses the
platform and builds the runner, restored from the Trial resources (a restarted
operator continues the same run) and seeded by warm start."""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from kubetune.controller import render, restore, warm_start
from kubetune.controller.checkpoints import CheckpointKeeper
from kubetune.controller.conditions import parse_rfc3339
from kubetune.controller.context import ExperimentContext, log
from kubetune.controller.effects import EffectQueue
from kubetune.controller.outcomes_status import warm_start_condition
from kubetune.controller.result_pump import ResultPump
from kubetune.controller.status_writer import StatusWriter
from kubetune.core.schedulers import scheduler_class
from kubetune.core.warm_trials import warm_trials
from kubetune.core.types import TrialPhase
from kubetune.executors.platform import PlatformRefused
from kubetune.spec import ExperimentSpec, SpecError, parse_experiment


class SpecIntake:
    def __init__(self, ctx: ExperimentContext, status: StatusWriter, effects: EffectQueue,
                 pump: ResultPump, checkpoints: CheckpointKeeper) -> None:
        self.ctx = ctx
        self.status = status
        self.effects = effects
        self.pump = pump
        self.checkpoints = checkpoints
        self.finished_at_start = False  # found finished for its spec: kept so, not restored

    async def take(self, body: Mapping[str, Any], generation: int | None) -> None:
        """Take the spec of ``body`` (``generation``), or say why not."""
        ctx = self.ctx
        now = ctx.clock()
        spec = await self._valid_spec(body, generation)
        if spec is None:
            ctx.generation = generation
            return
        self.status.spec_problem = None
        if ctx.runner is None:
            try:
                ctx.platform = ctx.registry.platform_for(spec, ctx.namespace)
            except PlatformRefused as error:
                ctx.generation = generation
                await self.status.fail_invalid_spec(str(error), generation, reason=error.reason)
                return
            if restore.finished_and_unchanged(body.get("status") or {}, generation):
                # finished stays finished: no restore, no trial; a spec change restores it
                self.status.written = dict(body.get("status") or {})
                self.finished_at_start = True
            else:
                # room for its first trial is kept while it is built (core/fair_share.py),
                # until its first cycle asks (ledger.watch) or it gives up; not for one that
                # ran before (a restart): its running trials are adopted as it is restored,
                # and holding everyone's second trial through every restore left the
                # cluster idle (issue 26, S3; operator_state._starting does the same)
                if not (body.get("status") or {}).get("startTime"):
                    ctx.platform.ledger.starting(ctx.prefix)
                try:
                    await self._restore(spec, body, now)
                finally:
                    if ctx.runner is None:
                        ctx.platform.ledger.unwatch(ctx.prefix)
        else:
            await self.effects.apply(ctx.runner.on_spec_changed(spec, now))
            rejection = ctx.runner.spec_rejection
            if rejection:
                self.status.spec_problem = ("SpecChangeRejected", rejection)
                await ctx.event("Warning", "SpecChangeRejected", rejection)
        ctx.spec = spec
        ctx.generation = generation

    async def _valid_spec(self, body: Mapping[str, Any], generation: int | None) -> ExperimentSpec | None:
        """The spec, or None once its rejection is shown: the Experiment Failed when nothing
        runs yet, else a condition and an Event (the last valid spec keeps running)."""
        ctx = self.ctx
        try:
            # off the event loop: a spec is bounded (spec/parse.py), yet every Experiment's
            # writes and the Lease wait for nothing one tenant sends (issue 25)
            spec = await asyncio.to_thread(parse_experiment, body.get("spec") or {})
            scheduler_class(spec)    # the scheduler's own checks: its name, what it needs
        except SpecError as error:
            if ctx.runner is None:
                await self.status.fail_invalid_spec(str(error), generation)
            else:   # keep running the last valid spec; say why the edit was not taken
                self.status.spec_problem = ("InvalidSpec", str(error))
                await ctx.event("Warning", "InvalidSpec", str(error))
            return None
        # what the trial template asks for beyond what this operator and namespace allow
        # (the platform's policy, e.g. spec/pod_policy.py), each naming its field
        refused = "; ".join(await ctx.registry.policy_violations(ctx.namespace, spec))
        if refused:
            if ctx.runner is None:
                await self.status.fail_invalid_spec(refused, generation, reason="PodSecurityViolation")
            else:   # keep running the last allowed spec
                self.status.spec_problem = ("PodSecurityViolation", refused)
                await ctx.store.event("Warning", "PodSecurityViolation", refused)
            return None
        return spec

    async def _restore(self, spec: ExperimentSpec, body: Mapping[str, Any], now: float) -> None:
        """Rebuild from the Trial resources: a restarted operator continues the same run."""
        ctx = self.ctx
        status = body.get("status") or {}
        start_time = parse_rfc3339(status["startTime"]) if status.get("startTime") else now
        warm, notes = await self.warm_start(spec, status)
        try:
            runner, trials = await restore.rebuild(
                spec, experiment=ctx.name, owner=ctx.prefix, start_time=start_time, status=status,
                generation=body.get("metadata", {}).get("generation"), list_trials=self._list_trials,
                warm_start=warm, warm_start_notes=notes)
        except SpecError as error:   # e.g. a search algorithm whose package is missing
            await self.status.fail_invalid_spec(str(error), ctx.body().get("metadata", {}).get("generation"))
            return
        runner.attach_ledger(ctx.platform.ledger)
        ctx.runner = runner
        # before the first poll: a donor's retention keeps what the operator has not yet seen
        for name in list(runner.trials):
            await self.checkpoints.clone(name, spec)
        self.status.seed(trials, status)
        if spec.checkpoint.delete_on_completion:   # idempotent: an earlier run may have done it
            self.checkpoints.to_delete.update((name, False) for name, trial in runner.trials.items()
                                              if trial.phase.is_terminal and trial.checkpoint)
        if ctx.results is not None:
            self.pump.unstored = {name: trial.last_seq for name, trial in runner.trials.items()
                                  if trial.phase is TrialPhase.RUNNING and trial.last_seq >= 0}
        if trials:
            log.info("%s/%s: restored %d trials", ctx.namespace, ctx.name, len(trials))
        if runner.searcher.warm_start_problems and not trials:   # once, not at every restart
            outcomes = runner.summary(now).outcomes
            for _, _, reason, message in warm_start_condition(outcomes, True):
                await ctx.event("Warning", reason, message)

    async def _list_trials(self) -> list[dict[str, Any]]:
        """The Experiment's Trials; their UIDs and parameters go to the results store too."""
        trials = await self.ctx.store.list_trials()
        if self.ctx.results is not None:
            for body in trials:
                self.ctx.results.trial(body)
        return trials

    async def warm_start(self, spec: ExperimentSpec, status: Mapping[str, Any]) -> tuple[list, list[str]]:
        """The succeeded trials of the Experiments ``spec.warmStart`` names, and what was
        not found: at the first start as they are, and recorded; after a restart the same
        trials again (controller/warm_start.py)."""
        ctx = self.ctx
        if spec.warm_start is None:
            return [], []
        recorded = {source.get("experiment"): source for source in status.get("warmStartSources") or ()}
        first_start = "warmStartSources" not in status
        warm, notes, sources = [], [], []
        for experiment in spec.warm_start.experiments:
            if experiment == ctx.name:
                notes.append(f"{experiment}: is this Experiment")
                continue
            listed = await ctx.store.list_trials_of(experiment)
            gone = ""
            if first_start or experiment not in recorded:
                source, chosen = warm_start.snapshot(experiment, listed)
            else:
                source = recorded[experiment]
                chosen, gone = warm_start.select(source, listed)
            sources.append(source)
            found = warm_trials(experiment, [render.trial_record(t) for t in chosen])
            if gone or not found:
                notes.append(gone or f"{experiment}: no succeeded Trials in namespace {ctx.namespace}")
            warm += found
        self.status.warm_sources = sources
        return warm, notes
