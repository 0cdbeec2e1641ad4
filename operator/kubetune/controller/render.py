"""Pure rendering of runner state into the status of Trial and Experiment resources.

The Experiment's status has a fixed size (counts, the best trial, the queue reason),
whatever its number of trials; a Trial carries its own history."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from kubetune.controller.conditions import parse_rfc3339, rfc3339, set_condition
from kubetune.controller.outcomes_status import objective_values, outcome_fields, read_objective_values
from kubetune.core.types import ExperimentSummary, TrialPhase, TrialRecord

TRIAL_COUNT_KEYS = ("pending", "queued", "running", "paused", "succeeded", "failed", "stopped")

# message tails kept on a Trial: a traceback can be long, the API object must not be
MAX_MESSAGE_CHARS = 4000
# each entry of status.failures keeps the error's first line (type and message); the
# Trial's message holds the traceback of the last one
MAX_FAILURE_MESSAGE_CHARS = 500


def trial_body(*, namespace: str, experiment: Mapping[str, Any], name: str, index: int,
               params: Mapping[str, Any], resources: Mapping[str, Any]) -> dict[str, Any]:
    meta = experiment["metadata"]
    return {
        "apiVersion": "kubetune.dev/v1alpha1",
        "kind": "Trial",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubetune.dev/experiment": meta["name"]},
            "ownerReferences": [{
                "apiVersion": "kubetune.dev/v1alpha1", "kind": "Experiment",
                "name": meta["name"], "uid": meta["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": {"experiment": meta["name"], "index": index,
                 "parameters": dict(params), "resources": dict(resources)},
    }


def trial_status(trial: Any) -> dict[str, Any]:
    """Status of one Trial from the runner's view of it (see core.runner)."""
    status: dict[str, Any] = {
        "phase": trial.phase.value,
        "reason": trial.reason or "",
        "message": (trial.message or "")[-MAX_MESSAGE_CHARS:],
        "iteration": trial.iteration,
        "lastResultSeq": trial.last_seq,
        "history": [dict(item) for item in trial.history],
        "attempt": trial.attempt,
    }
    if trial.history:
        status["lastMetrics"] = dict(trial.history[-1])
    if trial.best_value is not None:
        status["bestMetric"] = trial.best_value
    if trial.checkpoint:
        status["checkpoint"] = trial.checkpoint
        status["checkpointIteration"] = trial.checkpoint_iteration
    if trial.failure_log:
        status["failures"] = [{**f, "message": (f.get("message") or "").split("\n", 1)[0][:MAX_FAILURE_MESSAGE_CHARS],
                               "time": rfc3339(f["time"])} for f in trial.failure_log]
    if trial.latest:
        status["objectiveValues"] = objective_values(trial.latest)
    if trial.infeasible:   # its results break spec.constraints: never best, never on the front
        status["infeasible"] = trial.infeasible[:MAX_FAILURE_MESSAGE_CHARS]
    if trial.parent:
        status["parent"] = trial.parent
    if trial.lineage:
        status["lineage"] = [dict(item) for item in trial.lineage]
    if trial.start_time is not None:
        status["startTime"] = rfc3339(trial.start_time)
    if trial.attempt_start is not None:
        status["attemptStartTime"] = rfc3339(trial.attempt_start)
    if trial.completion_time is not None:
        status["completionTime"] = rfc3339(trial.completion_time)
    return status


def trial_record(body: Mapping[str, Any]) -> TrialRecord:
    """A persisted Trial resource -> what the runner needs to rebuild itself."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    return TrialRecord(
        name=body["metadata"]["name"],
        index=int(spec.get("index", 0)),
        params=dict(spec.get("parameters") or {}),
        phase=TrialPhase(status.get("phase", "Pending")),
        history=tuple(status.get("history") or ()),
        checkpoint=status.get("checkpoint"),
        # retries caused by the cluster (Ray restarted) do not count against maxFailures
        failures=sum(1 for f in status.get("failures") or () if f.get("reason") != "ClusterFault"),
        reason=status.get("reason", ""),
        message=status.get("message", ""),
        parent=status.get("parent"),
        attempt=int(status.get("attempt", 0)),
        iteration=status.get("iteration"),
        last_result_seq=status.get("lastResultSeq"),
        checkpoint_iteration=status.get("checkpointIteration"),
        lineage=tuple(status.get("lineage") or ()),
        attempt_start=parse_rfc3339(status["attemptStartTime"]) if status.get("attemptStartTime") else None,
        latest_metrics=read_objective_values(status.get("objectiveValues")),
        failure_log=tuple({**f, "time": parse_rfc3339(f["time"]) if isinstance(f.get("time"), str) else f.get("time")}
                          for f in status.get("failures") or ()),
    )


def experiment_status(summary: ExperimentSummary, *, total: int, previous: Mapping[str, Any],
                      generation: int | None, now: float, suspended: bool,
                      extra_conditions: Iterable[tuple[str, bool, str, str]] = ()) -> dict[str, Any]:
    """The Experiment's status: phase, conditions, counts, best trial, queue reason."""
    counts = {key: summary.counts.get(key.capitalize(), 0) for key in TRIAL_COUNT_KEYS}
    counts["created"] = summary.created
    done = counts["succeeded"] + counts["failed"] + counts["stopped"]
    conditions = list(previous.get("conditions") or [])

    finished = summary.finished
    if finished is not None:
        phase = finished.phase
        succeeded = phase == "Succeeded"
        conditions = set_condition(conditions, "Running", False, finished.reason, finished.message,
                                   now=now, generation=generation)
        conditions = set_condition(conditions, "Succeeded", succeeded, finished.reason,
                                   finished.message, now=now, generation=generation)
        conditions = set_condition(conditions, "Failed", not succeeded, finished.reason,
                                   finished.message, now=now, generation=generation)
        message = finished.message
    elif suspended:
        phase = "Suspended"
        message = "suspended: no new trials are launched"
        conditions = set_condition(conditions, "Suspended", True, "Suspended", message,
                                   now=now, generation=generation)
        conditions = set_condition(conditions, "Running", False, "Suspended", message,
                                   now=now, generation=generation)
    else:
        phase = "Running"
        message = f"{counts['running']} running, {counts['queued']} queued, {done}/{total} done"
        conditions = set_condition(conditions, "Running", True, "TrialsRunning", message,
                                   now=now, generation=generation)
        if any(c["type"] == "Suspended" for c in conditions):
            conditions = set_condition(conditions, "Suspended", False, "Resumed", "",
                                       now=now, generation=generation)
    if finished is None:
        # the run goes on (maxTrials raised, a fixed spec): conditions describe this
        # generation, so an earlier outcome is withdrawn (kubectl wait must not return)
        for type_ in ("Succeeded", "Failed"):
            if any(c["type"] == type_ and c["status"] == "True" for c in conditions):
                conditions = set_condition(conditions, type_, False, "Resumed", "", now=now, generation=generation)
    queued = counts["queued"] > 0 and finished is None
    if queued or any(c["type"] == "Queued" for c in conditions):
        conditions = set_condition(conditions, "Queued", queued, "TrialsQueued" if queued else "NoneQueued",
                                   summary.queue_reason if queued else "", now=now, generation=generation)
    for type_, value, reason, text in extra_conditions:
        conditions = set_condition(conditions, type_, value, reason, text, now=now, generation=generation)
    if generation is not None:   # each one was judged again for this generation
        conditions = [{**c, "observedGeneration": generation} for c in conditions]

    status: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "conditions": conditions,
        "progress": f"{done}/{total}",
        "trialCounts": counts,
        "queueReason": summary.queue_reason or "",
        "startTime": previous.get("startTime") or rfc3339(now),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if summary.best_trial is not None:
        status["bestTrial"] = {"name": summary.best_trial, "parameters": dict(summary.best_params or {}),
                               "metric": summary.best_metric, "iteration": summary.best_iteration}
    if finished is not None:
        status["completionTime"] = previous.get("completionTime") or rfc3339(now)
    status.update(outcome_fields(summary.outcomes))
    return status
