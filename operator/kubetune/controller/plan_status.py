"""``status.plan`` of a suspended Experiment: what it will cost, written before anything
launches (core/plan.py), so a reviewer or a policy reads it with ``kubectl get``.

On a cluster the node types are the Ray cluster's: the nodes it has now (grouped by
shape) and the shapes its autoscaler can add (how many it may add is the autoscaler's
own limit, not known here).  Computed once per spec generation and cluster shape: a
plan plays out the scheduler's rungs (core/schedulers/rungs.py), a fraction of a second
for thousands of trials, not something to redo on every status write."""
from __future__ import annotations

from typing import Any

from kubetune.core.plan import NodeType, PlanError, plan
from kubetune.core.resources import ResourceLedger
from kubetune.spec.model import ExperimentSpec


def node_types(ledger: ResourceLedger | None) -> list[NodeType] | None:
    if ledger is None or not ledger.growth_known:     # unknown until the node types are read
        return None
    nodes, autoscaled = ledger.node_shapes()
    grouped: dict[str, tuple[Any, int]] = {}
    for node in nodes:
        shape, count = grouped.get(node.describe(), (node, 0))
        grouped[node.describe()] = (shape, count + 1)
    found = [NodeType(f"node: {described}", shape, count) for described, (shape, count) in grouped.items()]
    found += [NodeType(f"autoscaler: {shape.describe()}", shape, None) for shape in autoscaled or []]
    return found


class PlanStatus:
    def __init__(self, experiment: str) -> None:
        self.experiment = experiment
        self._key: tuple[Any, ...] | None = None
        self._body: dict[str, Any] = {}

    def get(self, spec: ExperimentSpec, generation: int | None, ledger: ResourceLedger | None) -> dict[str, Any]:
        shapes = node_types(ledger)
        key = (generation, id(spec), repr(shapes))
        if key != self._key:
            try:
                self._body = plan(spec, study_name=self.experiment, node_types=shapes).to_json()
            except PlanError as exc:
                self._body = {"error": str(exc)[:1024]}
            self._key = key
        return self._body
