"""Restoring an Experiment after an operator restart, off the event loop.

A finished Experiment whose spec did not change since is not restored at all (it
starts nothing); the others are rebuilt from their Trials in a worker thread, a few at
a time, so that the loop (kopf's liveness probe, the other Experiments) keeps running
while a large Experiment replays its history."""
from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any, Awaitable, Callable, Mapping

from kubetune.controller import render
from kubetune.core.runner import TrialRunner
from kubetune.core.types import FinishExperiment
from kubetune.spec import ExperimentSpec

# what the runner itself ends a run with (a Failed InvalidSpec is the controller's, not an outcome)
RUNNER_OUTCOMES = frozenset({"GoalReached", "MaxTrialsReached", "SearchSpaceExhausted", "MaxDurationReached",
                             "MaxFailedTrialsReached", "Infeasible"})
# restores at once: each holds a LIST of full Trials and builds a study; more at once
# would only share the same interpreter (GIL) and add their memory up
CONCURRENT_RESTORES = 2
# one semaphore per event loop: an asyncio.Semaphore binds to the loop it first waits
# on, and a process may run several loops one after another (tests, benchmarks)
_slots: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()


def outcome(status: Mapping[str, Any]) -> FinishExperiment | None:
    """How the run ended, from the Experiment's status; None if it has not."""
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    for condition in status.get("conditions") or ():
        if (condition.get("type") == phase and condition.get("status") == "True"
                and condition.get("reason") in RUNNER_OUTCOMES):
            return FinishExperiment(phase, condition["reason"], condition.get("message") or "")
    return None


def finished_and_unchanged(status: Mapping[str, Any], generation: int | None) -> bool:
    """Finished by the runner for this very spec: nothing to restore, nothing to start."""
    return outcome(status) is not None and generation is not None and status.get("observedGeneration") == generation


async def rebuild(spec: ExperimentSpec, *, experiment: str, owner: str, start_time: float,
                  status: Mapping[str, Any], generation: int | None,
                  list_trials: Callable[[], Awaitable[list[dict[str, Any]]]],
                  **runner_options: Any) -> tuple[TrialRunner, list[dict]]:
    """A runner rebuilt from the Experiment's Trials (listed and replayed a few
    Experiments at a time, the replay in a thread; one never started at once), without
    the shared ledger yet."""
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        slots = _slots[loop] = asyncio.Semaphore(CONCURRENT_RESTORES)
    # An Experiment that never started (no status.startTime: its first status write has
    # not happened) has no history to replay, at most the Trials of one cut-short first
    # cycle: it does not wait behind the restores of others.  200 Experiments applied at
    # once were built two at a time, and the last ones reached the shared queue seconds
    # after the first ones had taken the whole cluster (issue 26: apply -> first Trial
    # p95 7-10 s, and the Experiments applied last got half their fair share).
    async with (slots if status.get("startTime") else contextlib.nullcontext()):
        trials = await list_trials()
        runner = await asyncio.to_thread(_replay, spec, experiment, owner, start_time, trials, runner_options)
    ended = outcome(status)
    if ended is not None:
        runner.restore_outcome(ended, spec_changed=status.get("observedGeneration") != generation)
    return runner, trials


def _replay(spec: ExperimentSpec, experiment: str, owner: str, start_time: float,
            trials: list[dict[str, Any]], runner_options: dict[str, Any]) -> TrialRunner:
    runner = TrialRunner(spec, experiment=experiment, start_time=start_time, ledger=None, owner=owner,
                         **runner_options)
    runner.restore([render.trial_record(t) for t in trials])
    return runner
