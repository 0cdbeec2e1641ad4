"""Builders shared by the unit tests (imported by name: pytest puts tests/unit on sys.path)."""
from __future__ import annotations

import copy
import json
import time
from typing import Any

from kubetune.core.resources import ResourceLedger, Resources
from kubetune.core.runner import TrialRunner
from kubetune.core.types import TrialRecord
from kubetune.spec import ExperimentSpec, parse_experiment

BASE = {
    "objective": {"metric": "loss", "mode": "min"},
    "searchSpace": {"x": {"uniform": [0, 1]}},
    "search": {"seed": 1},
    "trial": {"entrypoint": "pkg.mod:train"},
}


def merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "searchSpace":
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def make_spec(**sections: Any) -> ExperimentSpec:
    return parse_experiment(merge(BASE, sections))


def make_runner(spec: ExperimentSpec, ledger: ResourceLedger | None = None, name: str = "exp", **kw) -> TrialRunner:
    return TrialRunner(spec, experiment=name, start_time=0.0, ledger=ledger, **kw)


def cpu_ledger(cpus: float, nodes: int = 1, node_types: list[Resources] | None = None) -> ResourceLedger:
    ledger = ResourceLedger()
    per_node = Resources(cpu=cpus / nodes)
    ledger.set_capacity(Resources(cpu=cpus), [per_node] * nodes, node_types)
    return ledger


def quadratic(params, iteration) -> float:
    """A learning curve: converges to (x - 0.3)^2, faster early."""
    return (params["x"] - 0.3) ** 2 + 1.0 / iteration


def records_of(runner: TrialRunner, *, without: tuple[str, ...] = ()) -> list[TrialRecord]:
    """What the controller persists on the Trial resources right now, read back as a
    restarted operator reads it: rendered, through strict JSON, and parsed again.
    ``without``: status fields left out (as an older operator wrote them)."""
    from kubetune.controller import render
    records = []
    for t in runner.trials.values():
        status = render.trial_status(t, objective=runner.spec.objective.metric,
                                     decision_state=runner.decision_state(t.name))
        status = {key: value for key, value in status.items() if key not in without}
        body = {"metadata": {"name": t.name},
                "spec": {"index": t.index, "parameters": dict(t.suggested_params or t.params)},
                "status": json.loads(json.dumps(status, allow_nan=False))}
        records.append(render.trial_record(body))
    return records


def of_type(decisions, cls) -> list:
    return [d for d in decisions if isinstance(d, cls)]


def wait_for(condition, timeout: float = 10.0):
    """Poll ``condition`` until it returns something truthy (returned), or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError("condition not met before the deadline")


def controller_with_runner(store, clock: list[float], **budget: Any):
    """An ExperimentController named ``exp`` over ``store``, on the clock ``clock[0]``,
    with a runner of that budget, and the runner's first decisions."""
    from kubetune.controller.experiment import ExperimentController
    spec = make_spec(budget=budget)
    body = {"metadata": {"name": "exp", "uid": "E"}, "spec": {}}
    controller = ExperimentController(namespace="ns", name="exp", store=store, registry=None,
                                      body=lambda: body, clock=lambda: clock[0])
    runner = make_runner(spec)
    controller.ctx.spec, controller.ctx.runner = spec, runner
    return controller, runner, runner.step(0.0)
