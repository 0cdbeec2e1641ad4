"""What runs on the platform against what the runner wants running.

After a restart (the operator was killed between recording an end and carrying it
out) and after any stop or pause (a platform's stop may not hold: unreachable for a
moment), the runs of trials that are over, paused or unknown are ended, and no launch
goes out until they are gone: a stopped trial must not keep its slot while another
starts (issue 15: measured 3 running with parallelism 2).  A finished Experiment's
leftovers are ended too (``end_runs_of_finished``)."""
from __future__ import annotations

from kubetune.controller.context import ExperimentContext, log
from kubetune.controller.write_failures import backoff
from kubetune.core.types import TrialPhase
from kubetune.spec.trial_key import TrialKey

# seconds between comparisons of what runs with what should (more often after a stop)
RECONCILE_RUNS_SECONDS = 10.0


class RunReconciler:
    def __init__(self, ctx: ExperimentContext) -> None:
        self.ctx = ctx
        # what runs is compared with what should at start-up, after stops, and every
        # RECONCILE_RUNS_SECONDS; runs found that should not (and did not end): no launch
        self.check_at = float("-inf")
        self.to_end: list[str] = []
        self.orphans_checked = False   # runs of trials that ended while no operator watched

    def check_soon(self) -> None:
        """A stop or pause goes out: make sure it ended before the next launch."""
        self.check_at = float("-inf")

    async def reconcile(self, now: float) -> None:
        """Compare what runs with what the runner wants running, and end the runs of trials
        that are over, paused or unknown.  Runs of active trials are left alone: launching
        the trial attaches to its run."""
        ctx = self.ctx
        if now < self.check_at:
            return
        keys = await ctx.platform.list_trials(ctx.prefix)
        extra = [key for key in keys if not self._should_run(TrialKey.parse(key).trial)]
        for key in extra:
            log.info("%s/%s: stopping %s: its trial is not running", ctx.namespace, ctx.name, key)
            await ctx.platform.stop(key)
        if extra:
            keys = await ctx.platform.list_trials(ctx.prefix)
            extra = [key for key in keys if not self._should_run(TrialKey.parse(key).trial)]
        self.to_end = extra
        self.check_at = now + (backoff(2) if extra else RECONCILE_RUNS_SECONDS)

    def _should_run(self, name: str) -> bool:
        trial = self.ctx.runner.trials.get(name)
        return trial is not None and not trial.phase.is_terminal and trial.phase is not TrialPhase.PAUSED

    async def end_runs_of_finished(self) -> None:
        """A finished Experiment has no live trial: end whatever still runs under it (an
        operator killed between finishing and stopping a trial), and withdraw the demand
        of the trials it left queued (the platform's ``end_runs``)."""
        ctx = self.ctx
        if ctx.runner is not None and ctx.runner.active_trials():
            return      # reopened meanwhile (a spec change in the same cycle)
        self.orphans_checked = await ctx.platform.end_runs(ctx.prefix)
