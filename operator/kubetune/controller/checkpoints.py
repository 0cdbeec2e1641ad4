"""The checkpoint effects of one Experiment: a PBT exploit's copy of the donor's
checkpoint, and checkpoint.deleteOnCompletion's removal of ended trials' checkpoints."""
from __future__ import annotations

import asyncio

from kubetune.controller.context import ExperimentContext, log
from kubetune.spec import ExperimentSpec


class CheckpointKeeper:
    def __init__(self, ctx: ExperimentContext) -> None:
        self.ctx = ctx
        # ended trials whose checkpoints go (checkpoint.deleteOnCompletion) -> announce it
        self.to_delete: dict[str, bool] = {}
        self.cloned: dict[str, tuple[str, str | None]] = {}   # trial -> (donor's checkpoint, its own copy)

    async def clone(self, name: str, spec: ExperimentSpec | None = None) -> None:
        """A PBT exploit: copy the donor's checkpoint into the trial's own storage now, while
        the donor still keeps it (its retention keeps the checkpoints among results not yet
        acknowledged by the next poll), so the trial never continues from, or retries from,
        a checkpoint the donor has deleted meanwhile."""
        ctx = self.ctx
        source = ctx.runner.borrowed_checkpoint(name)
        storage = ctx.storage(spec)
        if source is None or not storage:
            return
        from kubetune.checkpoints.storage import CheckpointOutsideStorage, clone_checkpoint_or_newer
        trial = ctx.runner.trials[name]
        try:
            copy = await asyncio.to_thread(clone_checkpoint_or_newer, source, storage, ctx.trial_key(name),
                                           trial.checkpoint_iteration)
        except CheckpointOutsideStorage as error:   # neither copied nor handed on: the trial starts afresh
            log.warning("%s/%s: %s refused for %s: %s", ctx.namespace, ctx.name, source, name, error)
            await ctx.store.trial_event(name, "Warning", "CheckpointRefused", f"{name}: {error}"[:1000])
            ctx.runner.on_checkpoint_cloned(name, source, None)
            self.cloned[name] = (source, None)    # a launch decided before this starts afresh too
            ctx.touched.add(name)
            return
        except Exception as error:  # noqa: BLE001 - storage the operator cannot reach: as before, the donor's
            log.warning("%s/%s: cannot copy %s for %s: %s", ctx.namespace, ctx.name, source, name, error)
            await ctx.event("Warning", "CheckpointNotCopied",
                            f"{name}: continues from {source} in place (copy failed: {error})"[:1000])
            return
        if ctx.runner.on_checkpoint_cloned(name, source, copy):
            self.cloned[name] = (source, copy)
            ctx.touched.add(name)

    def launch_from(self, name: str, checkpoint: str | None) -> str | None:
        """The checkpoint a launch decided before the copy should start from: the copy."""
        source, copy = self.cloned.get(name, (None, None))
        return copy if checkpoint is not None and checkpoint == source else checkpoint

    async def delete_ended(self) -> None:
        """checkpoint.deleteOnCompletion: remove the checkpoints of ended trials, except
        those another trial is still to resume from (a PBT exploit)."""
        ctx = self.ctx
        storage = ctx.storage()
        if not storage:
            self.to_delete.clear()
            return
        from kubetune.checkpoints.storage import delete_trial_checkpoints
        needed = {ctx.runner.trials[name].checkpoint for name in ctx.runner.active_trials()}
        for name, announce in sorted(self.to_delete.items()):
            key = ctx.trial_key(name)
            if any(location and f"/{key}/" in location for location in needed):
                continue
            try:
                await asyncio.to_thread(delete_trial_checkpoints, storage, key)
            except Exception as error:  # noqa: BLE001 - storage trouble must not stop the experiment
                log.warning("%s/%s: cannot delete the checkpoints of %s: %s", ctx.namespace, ctx.name, name, error)
            else:
                if announce:   # not again for trials an earlier operator process ended
                    await ctx.event("Normal", "CheckpointsDeleted",
                                    f"{name}: its checkpoints were removed (checkpoint.deleteOnCompletion)")
            self.to_delete.pop(name, None)
