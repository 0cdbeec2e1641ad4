"""Pure rendering of runner state into the status of Trial and Experiment resources.

Both are bounded whatever happens (issue 14), and valid JSON (``core.sanitize``; the
store runs the same sanitiser again on every write):

- the Experiment's status has a fixed size (counts, the best trial, the queue reason,
  one message and a fixed set of conditions of at most 1 KiB each), under 16 KiB;
- a Trial's status holds the last metrics, the best value, the iteration, attempt and
  checkpoint, the state its scheduler and the study decide on (``decisionState``) and
  a downsampled curve (``history``, core/curve.py) -- under 64 KiB, and the same size
  at result 30,000 as at result 100.  Every result is kept in the results store."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from kubetune.controller.conditions import kstatus_conditions, parse_rfc3339, rfc3339, set_condition
from kubetune.controller.outcomes_status import capped_param, objective_values, outcome_fields, read_objective_values
from kubetune.core.runner import NOT_COUNTED
from kubetune.core.sanitize import MAX_MESSAGE_BYTES, cap_text, decode_number, fit, json_safe, json_size
from kubetune.core.trial import KEPT_LINEAGE
from kubetune.core.types import ExperimentSummary, TrialPhase, TrialRecord

TRIAL_COUNT_KEYS = ("pending", "queued", "running", "paused", "succeeded", "failed", "stopped")

MAX_TRIAL_BYTES = 64 * 1024           # the whole Trial object (issue 14)
MAX_TRIAL_STATUS_BYTES = 56 * 1024    # its status, leaving room for metadata and spec
MAX_EXPERIMENT_STATUS_BYTES = 12 * 1024
# what fit() never cuts nor drops, whatever a trial reports: what a restarted operator, kubectl
# and Argo CD read the outcome and progress from (and date-times a cut would make invalid)
EXPERIMENT_STATUS_KEPT = ("phase", "startTime", "completionTime", "trialCounts", "progress", "observedGeneration")
TRIAL_STATUS_KEPT = ("phase", "attempt", "iteration", "lastResultSeq", "startTime", "attemptStartTime",
                     "completionTime", "queuedSince", "usage")
# a Trial's message keeps the start of a traceback (the error is its first line) and
# its end (where it was raised); the results store keeps it whole
MAX_MESSAGE_CHARS = 8000
# each entry of status.failures keeps the error's first line (type and message); the
# Trial's message holds the traceback of the last one
MAX_FAILURE_MESSAGE_CHARS = 500
KEPT_FAILURES = 20                    # status.failures keeps the latest; failureCount counts all
MAX_METRICS_BYTES = 4096              # lastMetrics
MAX_SHOWN_STRING_CHARS = 200          # a string metric in lastMetrics and history (the store keeps it whole)
MAX_POINT_BYTES = 512                 # one point of the curve


def _bounded_metrics(metrics: Mapping[str, Any], objective: str | None, max_bytes: int) -> dict[str, Any]:
    """``metrics`` JSON-safe, keeping the objective and iteration first and as many other
    metrics as fit in ``max_bytes`` (a trial may report thousands)."""
    safe = json_safe(dict(metrics), max_string=MAX_SHOWN_STRING_CHARS)
    first = [k for k in ("iteration", objective) if k in safe]
    kept = {k: safe[k] for k in first}
    size = json_size(kept)
    for key, value in safe.items():
        if key in kept:
            continue
        extra = json_size({key: value}) - 1
        if size + extra > max_bytes:
            continue
        kept[key] = value
        size += extra
    return kept


def _traceback(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    half = MAX_MESSAGE_CHARS // 2
    return message[:half] + "\n...\n" + message[-half:]


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


def trial_status(trial: Any, *, objective: str | None = None,
                 decision_state: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Status of one Trial from the runner's view of it (see core.runner), bounded."""
    status: dict[str, Any] = {
        "phase": trial.phase.value,
        "reason": cap_text(trial.reason or "", 256),
        "message": _traceback(trial.message or ""),
        "iteration": trial.iteration,
        "lastResultSeq": trial.last_seq,
        "history": [_bounded_metrics(point, objective, MAX_POINT_BYTES) for point in trial.history],
        "historyStride": trial.history_stride,
        "attempt": trial.attempt,
    }
    if trial.last_metrics is not None:
        status["lastMetrics"] = _bounded_metrics(trial.last_metrics, objective, MAX_METRICS_BYTES)
    if trial.last_value is not None:
        # a number, or "NaN" / "Infinity" / "-Infinity" (the Trial's Last column)
        status["lastObjective"] = trial.last_value
    if trial.best_value is not None:
        status["bestMetric"] = trial.best_value
        status["bestIteration"] = trial.best_iteration
    if decision_state:
        status["decisionState"] = dict(decision_state)
    if trial.checkpoint:
        status["checkpoint"] = trial.checkpoint
        status["checkpointIteration"] = trial.checkpoint_iteration
    if trial.failure_log:
        # the log keeps the last KEPT_FAILURES: past them (and restored from them) the count is the runner's
        status["failureCount"] = max(trial.failures, sum(1 for f in trial.failure_log
                                                         if f.get("reason") not in NOT_COUNTED))
        status["failures"] = [{**f, "message": (f.get("message") or "").split("\n", 1)[0][:MAX_FAILURE_MESSAGE_CHARS],
                               "time": rfc3339(f["time"])} for f in trial.failure_log[-KEPT_FAILURES:]]
    if trial.latest:
        status["objectiveValues"] = objective_values(trial.latest)
    if trial.infeasible:   # its results break spec.constraints: never best, never on the front
        status["infeasible"] = trial.infeasible[:MAX_FAILURE_MESSAGE_CHARS]
    if trial.parent:
        status["parent"] = trial.parent
    if trial.lineage:
        status["lineage"] = [dict(item) for item in trial.lineage[-KEPT_LINEAGE:]]
    if trial.start_time is not None:
        status["startTime"] = rfc3339(trial.start_time)
    if trial.attempt_start is not None:
        status["attemptStartTime"] = rfc3339(trial.attempt_start)
    if trial.completion_time is not None:
        status["completionTime"] = rfc3339(trial.completion_time)
    if trial.queued_since is not None:
        status["queuedSince"] = rfc3339(trial.queued_since)
    if trial.queue_waits:
        status["queueWaitSeconds"] = round(trial.queue_wait_s, 3)
        status["admissions"] = trial.queue_waits
    if trial.evictions:
        status["evictions"] = trial.evictions
    if trial.launched or trial.usage.queue_s:
        status["usage"] = trial.usage.to_status(trial.queue_wait_s)   # numbers only: never what fit() cuts
    return fit(json_safe(status), MAX_TRIAL_STATUS_BYTES, keep=TRIAL_STATUS_KEPT)


def _decoded(value: Any) -> Any:
    """Numbers in the documented non-finite string form back to floats, at any depth."""
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return decode_number(value)


def _moment(status: Mapping[str, Any], key: str) -> float | None:
    """A date-time field of a status as epoch seconds (None: absent)."""
    return parse_rfc3339(status[key]) if status.get(key) else None


def trial_record(body: Mapping[str, Any]) -> TrialRecord:
    """A persisted Trial resource -> what the runner needs to rebuild itself (from the
    bounded status alone: see TrialRunner.restore)."""
    spec = body.get("spec") or {}
    status = dict(body.get("status") or {})
    for key in ("history", "lastMetrics", "lastObjective", "bestMetric", "decisionState", "objectiveValues"):
        if key in status:
            status[key] = _decoded(status[key])
    failures = status.get("failures") or ()
    counted = sum(1 for f in failures if f.get("reason") not in NOT_COUNTED)
    last_value = status.get("lastObjective")
    phase = TrialPhase(status.get("phase", "Pending"))
    # its launch was deferred (LaunchDeferred): nothing of it ran, and the time since the
    # decision is not the run spec.trial.timeout counts; restored, its run counts from then
    deferred = phase is TrialPhase.QUEUED and bool(status.get("launched")) and status.get("reason") == "LaunchDeferred"
    if phase is TrialPhase.QUEUED and status.get("launched"):
        # launched, and queued by the platform (controller/platform_queue.py): running to
        # the runner, and the platform's reason is not the trial's
        phase = TrialPhase.RUNNING
        status["reason"] = status["message"] = ""
    return TrialRecord(
        name=body["metadata"]["name"],
        index=int(spec.get("index", 0)),
        params=dict(spec.get("parameters") or {}),
        phase=phase,
        history=tuple(status.get("history") or ()),
        checkpoint=status.get("checkpoint"),
        # retries caused by the cluster (Ray restarted) do not count against maxFailures
        failures=max(counted, int(status.get("failureCount") or 0)),
        reason=status.get("reason", ""),
        message=status.get("message", ""),
        parent=status.get("parent"),
        attempt=int(status.get("attempt", 0)),
        iteration=status.get("iteration"),
        last_result_seq=status.get("lastResultSeq"),
        checkpoint_iteration=status.get("checkpointIteration"),
        lineage=tuple(status.get("lineage") or ()),
        start_time=_moment(status, "startTime"),
        completion_time=_moment(status, "completionTime"),
        queued_since=_moment(status, "queuedSince"),
        attempt_start=None if deferred else _moment(status, "attemptStartTime"),
        latest_metrics=read_objective_values(status.get("objectiveValues")),
        failure_log=tuple({**f, "time": parse_rfc3339(f["time"]) if isinstance(f.get("time"), str) else f.get("time")}
                          for f in failures),
        history_stride=int(status.get("historyStride") or 1),
        last_metrics=status.get("lastMetrics"),
        last_value=float(last_value) if isinstance(last_value, (int, float)) and not isinstance(last_value, bool) else None,
        best_value=status.get("bestMetric"),
        best_iteration=status.get("bestIteration"),
        decision_state=status.get("decisionState"),
        queue_wait_s=float(status.get("queueWaitSeconds") or 0.0),
        usage=status.get("usage") if isinstance(status.get("usage"), Mapping) else None,
        queue_waits=int(status.get("admissions") or 0),
        evictions=int(status.get("evictions") or 0),
    )


def _stuck_on(extra_conditions: list[tuple[str, bool, str, str]], previous: Mapping[str, Any], now: float) -> str:
    """What holds a running Experiment up, for the first line a user reads (status.message,
    kubectl get -o wide, Argo CD), with since when and the fix; "" when nothing does."""
    for type_, value, _reason, text in extra_conditions:
        if type_ == "RayUnavailable" and value:
            before = next((c for c in previous.get("conditions") or []
                           if c.get("type") == "RayUnavailable" and c.get("status") == "True"), None)
            since = (before or {}).get("lastTransitionTime") or rfc3339(now)
            since = since.split(".")[0].removesuffix("Z") + "Z"      # to the second: for people
            return (f"{text} (since {since}; retrying): check spec.ray.address, or the operator's "
                    f"--ray-address when it names none, and that the Ray head is up")
    return ""


def _phase(summary: ExperimentSummary, counts: Mapping[str, int], done: str, conditions: list[dict[str, Any]],
           previous: Mapping[str, Any], extra_conditions: list[tuple[str, bool, str, str]],
           blocked: tuple[str, str] | None, suspended: bool, now: float,
           generation: int | None) -> tuple[str, str, str, list[dict[str, Any]]]:
    """The phase machine: blocked, finished, suspended or running; the phase, its reason
    and message, and the conditions that say so."""
    finished = summary.finished
    if blocked is not None and finished is None:
        # the operator cannot do its work (e.g. a missing permission): Failed while it
        # lasts, with the reason; the loop retries and clears it once the cause is gone
        phase, (reason, message) = "Failed", blocked
        conditions = set_condition(conditions, "Failed", True, reason, message, now=now, generation=generation)
        conditions = set_condition(conditions, "Running", False, reason, message, now=now, generation=generation)
    elif finished is not None:
        phase, reason = finished.phase, finished.reason
        succeeded = phase == "Succeeded"
        conditions = set_condition(conditions, "Running", False, finished.reason, finished.message,
                                   now=now, generation=generation)
        conditions = set_condition(conditions, "Succeeded", succeeded, finished.reason,
                                   finished.message, now=now, generation=generation)
        conditions = set_condition(conditions, "Failed", not succeeded, finished.reason,
                                   finished.message, now=now, generation=generation)
        message = finished.message
    elif suspended:
        phase, reason = "Suspended", "Suspended"
        message = "suspended: no new trials are launched"
        conditions = set_condition(conditions, "Suspended", True, "Suspended", message,
                                   now=now, generation=generation)
        conditions = set_condition(conditions, "Running", False, "Suspended", message,
                                   now=now, generation=generation)
    else:
        phase, reason = "Running", "TrialsQueued" if counts["queued"] and not counts["running"] else "TrialsRunning"
        message = f"{counts['running']} running, {counts['queued']} queued, {done}"
        if counts["queued"] and summary.queue_reason:     # what the queued ones wait for
            message = f"{message}; queued: {summary.queue_reason}"
        cause = _stuck_on(extra_conditions, previous, now)
        if cause:      # the counts alone would not say why nothing moves
            message = f"{cause}; {message}"
        conditions = set_condition(conditions, "Running", True, "TrialsRunning", message,
                                   now=now, generation=generation)
        if any(c["type"] == "Suspended" for c in conditions):
            conditions = set_condition(conditions, "Suspended", False, "Resumed", "",
                                       now=now, generation=generation)
    return phase, reason, message, conditions


def experiment_status(summary: ExperimentSummary, *, total: int, previous: Mapping[str, Any],
                      generation: int | None, now: float, suspended: bool,
                      extra_conditions: Iterable[tuple[str, bool, str, str]] = (),
                      blocked: tuple[str, str] | None = None,
                      kept: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Experiment's status: phase, conditions, counts, best trial, queue reason.
    ``extra_conditions``: (type, status, reason, message) of the conditions its caller judged.
    ``kept``: fields a restarted operator needs as written (bounded by their writer),
    never cut, like the conditions (e.g. ``warmStartSources``)."""
    extra_conditions = list(extra_conditions)
    counts = {**{key: summary.counts.get(key.capitalize(), 0) for key in TRIAL_COUNT_KEYS}, "created": summary.created}
    done = counts["succeeded"] + counts["failed"] + counts["stopped"]
    conditions = list(previous.get("conditions") or [])
    finished = summary.finished
    phase, reason, message, conditions = _phase(summary, counts, f"{done}/{total} done", conditions, previous,
                                                extra_conditions, blocked, suspended, now, generation)
    conditions = _judged_conditions(conditions, summary, counts, phase, reason, message, extra_conditions,
                                    going_on=finished is None and blocked is None, now=now, generation=generation)
    status: dict[str, Any] = {
        "phase": phase,
        "message": cap_text(message, MAX_MESSAGE_BYTES),
        "conditions": conditions,
        "progress": f"{done}/{total}",
        "trialCounts": counts,
        "queueReason": summary.queue_reason or "",
        "startTime": previous.get("startTime") or rfc3339(now),
    }
    status.update({"observedGeneration": generation} if generation is not None else {})
    if summary.best_trial is not None:
        # values cut as on the Pareto front: one long choice must not crowd out the rest
        status["bestTrial"] = {"name": summary.best_trial,
                               "parameters": {k: capped_param(v) for k, v in (summary.best_params or {}).items()},
                               "metric": summary.best_metric, "iteration": summary.best_iteration}
    if finished is not None:
        status["completionTime"] = previous.get("completionTime") or rfc3339(now)
    status.update(outcome_fields(summary.outcomes))
    if summary.admissions:   # the status field's name says which queue: spec.queue is Kueue's
        status["kueue"] = dict(summary.admissions)
    if summary.usage is not None:
        status["usage"] = dict(summary.usage)
    # Conditions are what kubectl wait, Argo CD and a restarted operator read the outcome
    # from: they are never what fit() cuts (each message is already capped at 1 KiB);
    # the rest is shrunk into what they leave.
    conditions = json_safe(status.pop("conditions"))
    kept = json_safe(dict(kept or {}))
    rest = fit(json_safe(status), max(MAX_EXPERIMENT_STATUS_BYTES - json_size(conditions) - json_size(kept), 2048),
               keep=EXPERIMENT_STATUS_KEPT)
    return {**rest, **kept, "conditions": conditions}


def _judged_conditions(conditions: list[dict[str, Any]], summary: ExperimentSummary, counts: Mapping[str, int],
                       phase: str, reason: str, message: str, extra_conditions: list[tuple[str, bool, str, str]], *,
                       going_on: bool, now: float, generation: int | None) -> list[dict[str, Any]]:
    """The Experiment's conditions after this phase: outcome, kstatus, Queued and the
    caller's ``extra_conditions``, each stamped with ``generation``."""
    if going_on:
        # the run goes on (maxTrials raised, a fixed spec, a permission granted): conditions describe this
        # generation, so an earlier outcome is withdrawn (kubectl wait must not return)
        for type_ in ("Succeeded", "Failed"):
            if any(c["type"] == type_ and c["status"] == "True" for c in conditions):
                conditions = set_condition(conditions, type_, False, "Resumed", "", now=now, generation=generation)
    conditions = kstatus_conditions(conditions, phase, reason, message, now=now, generation=generation)
    queued = counts["queued"] > 0 and summary.finished is None
    if queued or any(c["type"] == "Queued" for c in conditions):
        conditions = set_condition(conditions, "Queued", queued, "TrialsQueued" if queued else "NoneQueued",
                                   summary.queue_reason if queued else "", now=now, generation=generation)
    for type_, value, why, text in extra_conditions:
        conditions = set_condition(conditions, type_, value, why, text, now=now, generation=generation)
    if generation is not None:   # each one was judged again for this generation
        conditions = [{**c, "observedGeneration": generation} for c in conditions]
    return conditions


def refused_status(previous: Mapping[str, Any], reason: str, message: str, *, now: float,
                   generation: int | None) -> dict[str, Any]:
    """The Experiment's status when its spec cannot run at all (invalid, refused by a
    policy, no permission): Failed with the reason, for this generation."""
    conditions = set_condition(previous.get("conditions") or [], "Failed", True, reason, message,
                               now=now, generation=generation)
    conditions = set_condition(conditions, "Running", False, reason, message, now=now, generation=generation)
    conditions = kstatus_conditions(conditions, "Failed", reason, message, now=now, generation=generation)
    return {"phase": "Failed", "message": cap_text(message), "conditions": conditions,
            "observedGeneration": generation}
