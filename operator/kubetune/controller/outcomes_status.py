"""The Experiment status fields for several objectives, reused and warm-start trials
(``status.paretoFront``, ``status.hypervolume``, ``status.reusedTrials``), rendered from
``core.pareto.Outcomes``; ``render.experiment_status`` merges them in.

Bounded in bytes whatever the parameters look like: at most MAX_FRONT_SHOWN points and
FRONT_BYTES of them, long values cut, so an Experiment stays far below 16 KiB."""
from __future__ import annotations

from typing import Any, Mapping

from kubetune.core.pareto import Outcomes
from kubetune.core.sanitize import decode_number, encode_number, json_size

MAX_FRONT_SHOWN = 10
FRONT_BYTES = 6000            # the shown points together, as JSON
MAX_VALUE_CHARS = 64          # a parameter value longer than this (a long choice) is cut
MAX_TEXT_CHARS = 300


def objective_values(latest: Mapping[str, float]) -> dict[str, float | str]:
    """A Trial's ``status.objectiveValues``: at most one number per objective and
    constraint metric (the spec bounds how many there are)."""
    return {name[:MAX_VALUE_CHARS * 4]: encode_number(value) for name, value in latest.items()}


def read_objective_values(raw: Any) -> dict[str, float] | None:
    if not isinstance(raw, Mapping):
        return None
    values = {}
    for name, value in raw.items():
        value = decode_number(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values[name] = float(value)
    return values


def capped_param(value: Any) -> Any:
    if isinstance(value, float):
        return encode_number(value)
    if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
        return value[:MAX_VALUE_CHARS] + "..."
    return value


def pareto_front(outcomes: Outcomes) -> dict[str, Any]:
    points: list[dict[str, Any]] = []
    used = 0
    for point in outcomes.front[:MAX_FRONT_SHOWN]:
        entry: dict[str, Any] = {"trial": point.trial,
                                 "values": {k: encode_number(v) for k, v in point.values.items()},
                                 "parameters": {k: capped_param(v) for k, v in point.params.items()}}
        if json_size(entry) > FRONT_BYTES // MAX_FRONT_SHOWN * 2:
            # too many parameters to show beside the others: the Trial has them
            entry["parameters"] = {}
            entry["parametersOmitted"] = True
        size = json_size(entry)
        if used + size > FRONT_BYTES:
            break
        points.append(entry)
        used += size
    return {"size": outcomes.front_size, "shown": len(points), "points": points}


def outcome_fields(outcomes: Outcomes | None) -> dict[str, Any]:
    """The status fields; empty when there is nothing to say."""
    if outcomes is None:
        return {}
    fields: dict[str, Any] = {}
    if outcomes.front_size is not None:
        fields["paretoFront"] = pareto_front(outcomes)
        if outcomes.hypervolume:
            fields["hypervolume"] = {"value": encode_number(outcomes.hypervolume[-1][1]),
                                     "history": [{"trials": k, "value": encode_number(v)}
                                                 for k, v in outcomes.hypervolume]}
    if outcomes.reused_count:
        fields["reusedTrials"] = {"count": outcomes.reused_count,
                                  "trials": [{"trial": t, "source": s[:MAX_TEXT_CHARS]} for t, s in outcomes.reused]}
    return fields


def warm_start_condition(outcomes: Outcomes | None, requested: bool) -> list[tuple[str, bool, str, str]]:
    """Condition WarmStarted: how many earlier trials seed the search, and why others could not."""
    if outcomes is None or not requested:
        return []
    message = f"{outcomes.warm_start_used} completed trials of earlier Experiments seed the search"
    if outcomes.warm_start_region:
        message += "; " + outcomes.warm_start_region
    if outcomes.warm_start_skipped:
        message += (f"; {outcomes.warm_start_skipped} could not be used: "
                    + "; ".join(outcomes.warm_start_problems))[:MAX_TEXT_CHARS * 3]
        return [("WarmStarted", outcomes.warm_start_used > 0, "SomeTrialsUnusable", message)]
    return [("WarmStarted", outcomes.warm_start_used > 0, "Seeded" if outcomes.warm_start_used else "NoTrials",
             message)]
