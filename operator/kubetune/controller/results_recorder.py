"""One Experiment's side of the results store: what the controller sees, as rows for
the operator's ResultsWriter (kubetune.results).  No I/O here: ``submit`` only queues.

Results are keyed by the Trial's UID (not its name, which a re-created Experiment
reuses), learnt when the Trial is created or listed (``uid``).  The result pump
(controller/result_pump.py) hands the results the runner took to the writer itself,
one row each; here it hands failures, and a trial's state from the runner's view each
time its Trial status is written; nothing is parsed from a rendered status.  The Trial
UIDs and parameters (from the API's answers to creating and listing Trials) and the
Experiment's phase (once its status is written) come from the effect queue, the spec
intake and the status writer, which hand them here: a status write passes through
nothing of the results store's."""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from typing import Any, Callable, Iterable, Mapping

from kubetune.results import Batch, ExperimentRow, FailureRow, TrialRow, UsageRow, study_meta
from kubetune.results.writer import ResultsWriter
from kubetune.spec.parse import parse_experiment

log = logging.getLogger(__name__)


class ResultsRecorder:
    def __init__(self, writer: ResultsWriter, namespace: str, body: Callable[[], Mapping[str, Any]]) -> None:
        self.writer = writer
        self.namespace = namespace
        self._body = body
        self._trials: dict[str, TrialRow] = {}    # name -> the last row submitted
        self._phase: str | None = None             # the Experiment's, as last submitted
        self._study: tuple[str, str] = ("", "")    # (spec as JSON, its study column): parsed once per spec
        self._usage: dict[str, list[UsageRow]] = {}   # trial -> the rows last stored

    @property
    def experiment_uid(self) -> str:
        return self._body()["metadata"]["uid"]

    def conditions(self, shown: Iterable[str]) -> list[tuple[str, bool, str, str]]:
        """The Experiment's ResultsStoreUnavailable and ResultsRejected conditions, each once
        it was ever needed (``shown``: the condition types the Experiment has already).

        The store's own error is never shown: it holds SQL text and the bound values of
        other Experiments' rows (other tenants').  It is in the operator's log."""
        shown, writer, found = set(shown), self.writer, []
        lost = f"; {writer.dropped} results were dropped (buffer full)" if writer.dropped else ""
        if writer.problem:
            found.append(("ResultsStoreUnavailable", True, "WriteFailed",
                          f"the results store cannot be written ({writer.problem_kind}); results are kept "
                          f"in memory and retried; the operator log has the details{lost}"))
        elif "ResultsStoreUnavailable" in shown or lost:
            found.append(("ResultsStoreUnavailable", False, "Written", f"results are stored{lost}"))
        rejected = writer.rejection(self.experiment_uid)
        if rejected is not None:
            found.append(("ResultsRejected", True, "RowsSetAside",
                          f"the results store refused {rejected.rows} row(s) of this Experiment "
                          f"({', '.join(rejected.kinds)}; first: {rejected.example}); they were set aside "
                          "and are not stored; the operator log has the details"))
        return found

    # ------------------------------------------------------------------ what the controller reports

    def experiment_status(self, status: Mapping[str, Any]) -> None:
        self._phase = str(status.get("phase") or self._phase or "")
        body = self._body()
        spec = body.get("spec") or {}
        # several objectives: the first is the one tables and plots lead with
        objective = spec.get("objective") or next(iter(spec.get("objectives") or []), {})
        self.writer.submit(Batch(experiments=[ExperimentRow(
            uid=self.experiment_uid, namespace=self.namespace, name=body["metadata"]["name"],
            metric=str(objective.get("metric", "")), mode=str(objective.get("mode", "min")),
            phase=self._phase, created=time.time(), study=self._study_column(spec))]))

    def _study_column(self, spec: Mapping[str, Any]) -> str:
        """Objectives, constraints and search space for study views (results/study_meta.py);
        "" for a spec that does not parse (the operator reports that elsewhere)."""
        key = json.dumps(spec, sort_keys=True, default=str)
        if key != self._study[0]:
            try:
                column = study_meta.from_spec(parse_experiment(spec))
            except Exception as error:  # noqa: BLE001 - never let a study view stop result recording
                log.debug("no study column for %s: %s", self._body()["metadata"]["name"], error)
                column = ""
            self._study = (key, column)
        return self._study[1]

    def trial(self, body: Mapping[str, Any]) -> None:
        """A Trial resource as created or listed: its UID, index and parameters."""
        if self._phase is None:   # `kubetune results` finds trials through their Experiment
            self.experiment_status({})
        meta, spec = body["metadata"], body.get("spec") or {}
        row = TrialRow(uid=meta.get("uid") or self._fallback_uid(meta["name"]), experiment_uid=self.experiment_uid,
                       name=meta["name"], index=int(spec.get("index", 0)), params=dict(spec.get("parameters") or {}))
        self._trials[row.name] = self._with_status(row, body.get("status") or {})
        self.writer.submit(Batch(trials=[self._trials[row.name]]))

    def trial_state(self, name: str, *, phase: str, reason: str, best: float | None, iteration: int,
                    attempt: int) -> None:
        """A trial's state as the runner has it (its phase as shown: Queued while the
        platform has not started it), stored when it changed."""
        row = self._trials.get(name)
        if row is None:
            return
        updated = dataclasses.replace(row, phase=phase, reason=reason, iteration=iteration, attempt=attempt,
                                      best=best if best is not None and math.isfinite(best) else None)
        if updated != row:
            self._trials[name] = updated
            self.writer.submit(Batch(trials=[updated]))

    def usage(self, name: str, usage: Mapping[str, Any]) -> None:
        """What the trial's attempts used (Trial.status.usage), one row per attempt, stored
        when it changed."""
        row = self._trials.get(name)
        if row is None:
            return
        rows = usage_rows(row.uid, usage)
        if rows and rows != self._usage.get(name):
            self._usage[name] = rows
            self.writer.submit(Batch(usage=rows))

    def failure(self, name: str, attempt: int, reason: str, message: str, now: float) -> None:
        """A failed attempt, with its whole error (the Trial keeps a capped tail)."""
        self.writer.submit(Batch(failures=[FailureRow(self.uid(name), attempt, reason, message, now)]))

    def settle(self, timeout: float) -> bool:
        """Wait (blocking, at most ``timeout``) until what was handed over is written;
        not at all while the store is failing."""
        return self.writer.problem is None and self.writer.flush(timeout)

    def stored_through(self, names: Iterable[str]) -> dict[str, int]:
        """The highest result seq the store holds per trial (-1: none).  Blocking."""
        uids = {self.uid(name): name for name in names}
        found = self.writer.read(lambda store: store.last_seqs(list(uids)))
        return {name: found.get(uid, -1) for uid, name in uids.items()}

    # ------------------------------------------------------------------ helpers

    def uid(self, name: str) -> str:
        """The Trial's UID, which keys its rows."""
        row = self._trials.get(name)
        return row.uid if row is not None else self._fallback_uid(name)

    def _fallback_uid(self, name: str) -> str:
        # not expected (a Trial is created or listed before it runs); stays unique per Experiment
        log.warning("%s/%s: no UID known for trial %s", self.namespace, self._body()["metadata"]["name"], name)
        return f"{self.experiment_uid}/{name}"

    @staticmethod
    def _with_status(row: TrialRow, status: Mapping[str, Any]) -> TrialRow:
        if not status:
            return row
        best = status.get("bestMetric", row.best)
        try:
            best = float(best) if best is not None else None
        except (TypeError, ValueError):   # a non-finite value in its JSON-safe written form
            best = None
        iteration = status.get("iteration", row.iteration)
        return TrialRow(uid=row.uid, experiment_uid=row.experiment_uid, name=row.name, index=row.index,
                        params=row.params, phase=str(status.get("phase") or row.phase),
                        reason=str(status.get("reason") or ""),
                        best=best if best is None or not math.isnan(best) else None,
                        iteration=int(iteration) if isinstance(iteration, int) else row.iteration,
                        attempt=int(status.get("attempt", row.attempt) or 0))


def usage_rows(trial_uid: str, usage: Any) -> list[UsageRow]:
    """The attempts a Trial's status.usage shows (the running one and the latest ended ones),
    as results-store rows: each write upserts them, so every attempt's row ends complete."""
    if not isinstance(usage, Mapping):
        return []
    rows = []
    ended_runs = usage.get("endedRuns") if isinstance(usage.get("endedRuns"), list) else []
    for run, ended in [*((run, True) for run in ended_runs[:8]), (usage.get("currentRun"), False)]:
        if not isinstance(run, Mapping):
            continue
        try:
            started, seen = float(run["startedAt"]), float(run["seenAt"])
            seconds = max(seen - started, 0.0)
            rows.append(UsageRow(trial_uid, int(run["attempt"]), started, seen if ended else None, seen, seconds,
                                 seconds * float(run.get("gpus", 0.0)), seconds * float(run.get("cpus", 0.0)),
                                 float(run.get("queuedSeconds", 0.0))))
        except (KeyError, TypeError, ValueError):
            continue
    return rows
