"""Trials the runner launched but the platform has not started: shown as Queued.

On a platform that places trials itself (pods: the kube-scheduler, Kueue) the runner
launches up to ``parallelism`` trials and counts them as running; one the platform
cannot place yet waits in the platform's queue.  The platform reports that
(``TrialUpdate.waiting_reason``/``waiting_message``), and this overlay shows such a trial as ``Queued`` with the scheduler's message, in the
Trial's status and in the Experiment's counts and queue reason, while the runner's
own bookkeeping stays as it is.  Pure; the controller feeds it every poll.

Such a Trial's status says ``launched: true`` beside ``phase: Queued``, so that a
restarted operator reads it as the runner had it, running (render.trial_record): it
re-attaches to the pod and keeps its slot, instead of taking it for a trial never
launched and starting another one in its slot.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from kubetune.core.types import ExperimentSummary, TrialPhase


class PlatformQueue:
    def __init__(self) -> None:
        self._waiting: dict[str, tuple[str, str]] = {}    # trial -> (reason, message)

    def note(self, name: str, reason: str, message: str) -> bool:
        """Record what the latest poll said of ``name``; True if that changed."""
        before = self._waiting.get(name)
        if reason:
            self._waiting[name] = (reason, message)
        else:
            self._waiting.pop(name, None)
        return self._waiting.get(name) != before

    def trial_status(self, name: str, status: Mapping[str, Any]) -> Mapping[str, Any]:
        waiting = self._waiting.get(name)
        if waiting is None or status.get("phase") != TrialPhase.RUNNING.value:
            return status
        return {**status, "phase": TrialPhase.QUEUED.value, "reason": waiting[0], "message": waiting[1],
                "launched": True}

    def summary(self, summary: ExperimentSummary, trials: Mapping[str, Any]) -> ExperimentSummary:
        """``trials``: the runner's trials by name (only running ones can wait)."""
        waiting = [name for name in self._waiting
                   if name in trials and trials[name].phase is TrialPhase.RUNNING]
        if not waiting:
            return summary
        counts = dict(summary.counts)
        counts[TrialPhase.RUNNING.value] = counts.get(TrialPhase.RUNNING.value, 0) - len(waiting)
        counts[TrialPhase.QUEUED.value] = counts.get(TrialPhase.QUEUED.value, 0) + len(waiting)
        return dataclasses.replace(summary, counts=counts,
                                   queue_reason=summary.queue_reason or self._waiting[waiting[0]][1])
