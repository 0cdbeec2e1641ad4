"""A trial's room, kept for the next trial of its Experiment (issue 26, cause 2).  Pure.

A platform may keep the worker of a trial that ended for its Experiment's next trial
(a pooled worker process), which then starts in it at once.  A new worker must first
start a process: 12-26 s on a busy 1-CPU cluster head, which starts them one at a time,
with the trial's slot held all the while.  The fair line (core/fair_share.py) gives
freed room to whoever is next, most often another Experiment, whose new worker then
evicts the idle one to make room.  With many small Experiments nearly every trial
started cold: 1.5 trials/s on the cluster where one Experiment ran 34.

So when a trial ends and its Experiment will launch another, its room is kept for that
one and passed to it out of turn (the ledger's ``pass_on``).  This is delay scheduling
(Zaharia et al., EuroSys 2010): the request first in line waits a little while the
room goes where the work starts warm.  It is bounded:
- only a run of at most ``SHORT_RUN_S`` keeps its room, and one room passes at most
  ``ledger.warm_passes`` times in a row; then it goes back to the line.  So whoever is
  first in line waits at most that many short runs per slot beyond its turn, however
  many Experiments keep rooms;
- only as many rooms as the runner can launch trials into (TrialRunner._keeps_room),
  never after a failed or hung run (its worker may be gone);
- never past a waiting higher priority, nor while Experiments are being built (their
  first trials go first: fair_share.kept_for_starting), nor while an Experiment waits
  that was granted fewer trials than the passer (rounds: measured at 200 Experiments on
  40 slots, passes without this rule ran 1.7x the trials but pushed the last
  Experiments' first trials back 2x, BENCHMARKS.md);
- each pass counts as a grant in the line's tie-breaks, so an Experiment that was
  passed rooms is served that much later: the long-run shares stay the line's;
- a kept room the runner's step did not use goes back to the line at the step's end.
"""
from __future__ import annotations

from kubetune.core.resources import ResourceLedger
from kubetune.spec.resources import Resources

# A run that lasted longer keeps no room: its warm worker would save the start of a worker
# process (seconds), while the request first in line waits a whole run for each pass.  So
# that request waits at most (passes x this) per slot beyond its turn.
SHORT_RUN_S = 60.0


def short_run(started: float | None, now: float) -> bool:
    return started is not None and now - started <= SHORT_RUN_S


class WarmRooms:
    """One runner's kept rooms in its ledger (None: no ledger, nothing kept); owners are
    its trials' ledger keys."""

    def __init__(self, ledger: ResourceLedger | None) -> None:
        self._ledger = ledger
        self._kept: list[tuple[str, int]] = []   # (owner whose trial ended, passes its room made)
        self._passes: dict[str, int] = {}        # holder -> passes its room made before it got it

    def __len__(self) -> int:
        return len(self._kept)

    def release(self, owner: str, priority: int, keep: bool) -> None:
        """``owner``'s trial ended (or paused): keep its room for the runner's next launch
        if ``keep`` (the runner will launch a trial that fits it: ``_keeps_room``) and the
        bounds allow; else it goes back to the line."""
        passes = self._passes.pop(owner, 0)
        ledger = self._ledger
        if ledger is None:
            return
        if keep and passes < ledger.warm_passes and ledger.may_pass_on(owner, priority):
            self._kept.append((owner, passes))
        else:
            ledger.release(owner)

    def acquire(self, owner: str, bundles: list[Resources], priority: int) -> bool:
        """A kept room, else a turn in the ledger's line (joining it if refused).  The
        bounds are asked again: a higher priority, or an Experiment being built, may have
        come while the room was kept (the controller's awaits between a trial's end and
        the step that launches the next)."""
        ledger = self._ledger
        if ledger is None:
            raise RuntimeError("a runner without a ledger acquires nothing")
        self._kept.sort(key=lambda entry: entry[0] == owner)   # its own (a pause relaunched) first
        while self._kept:
            holder, passes = self._kept.pop()
            if ledger.may_pass_on(holder, priority) and ledger.pass_on(holder, owner, bundles):
                self._passes[owner] = passes + 1
                return True
            ledger.release(holder)
        ledger.set_waiting(owner, bundles, priority)
        return ledger.try_acquire(owner, bundles, priority)

    def let_go(self) -> None:
        """Every kept room back to the line (the step is over: nothing more starts now)."""
        kept, self._kept = self._kept, []
        for holder, _ in kept:
            self._ledger.release(holder)     # (only kept with a ledger)
