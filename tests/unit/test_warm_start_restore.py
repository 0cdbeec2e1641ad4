"""A restarted operator seeds its search with the same warm-start trials as the first
start (controller/warm_start.py), whatever happened to the source Experiments since.

A unit test: what is at stake is which Trials are chosen from a listing and what the
Experiment's status records; listing Trials and writing the status on a real control
plane are covered by test_multi_objective_run.py's warm start."""
from __future__ import annotations

import asyncio
import json

from kubetune.controller import render
from kubetune.controller.experiment import ExperimentController
from kubetune.controller.store import MemoryStore
from kubetune.controller.warm_start import select, snapshot
from unit_helpers import make_spec


def trial(index: int, phase: str, uid: str = "uid-1", loss: float = 1.0) -> dict:
    status = {"phase": phase}
    if phase == "Succeeded":
        status.update(lastMetrics={"loss": loss}, lastObjective=loss, history=[{"iteration": 1, "loss": loss}])
    return {"metadata": {"name": f"early-{index}", "creationTimestamp": f"2026-01-01T00:00:{index:02d}Z",
                         "ownerReferences": [{"kind": "Experiment", "name": "early", "uid": uid}]},
            "spec": {"index": index, "parameters": {"x": index / 10}}, "status": status}


def test_a_restart_uses_the_trials_the_first_start_used():
    first = [trial(0, "Succeeded"), trial(1, "Running"), trial(2, "Failed")]
    record, used = snapshot("early", first)
    assert [t["metadata"]["name"] for t in used] == ["early-0", "early-1", "early-2"]
    record = json.loads(json.dumps(record))     # as the status holds it
    # meanwhile the source went on: early-1 succeeded, early-3 started and succeeded
    later = [trial(0, "Succeeded"), trial(1, "Succeeded"), trial(2, "Failed"), trial(3, "Succeeded")]
    chosen, gone = select(record, later)
    assert gone == "" and [t["metadata"]["name"] for t in chosen] == ["early-0", "early-2"]
    # deleted (or re-created: another UID) since: said, and nothing else taken in its place
    assert select(record, [])[1].startswith("early: deleted or re-created")
    assert select(record, [trial(0, "Succeeded", uid="uid-2")]) == ([], select(record, [])[1])
    # a source with no Trials at the first start seeds nothing later either
    empty, _ = snapshot("early", [])
    assert select(empty, later) == ([], "")


class Sources(MemoryStore):
    def __init__(self, trials: list[dict]) -> None:
        super().__init__()
        self.source_trials = trials

    async def list_trials_of(self, experiment: str) -> list[dict]:
        return list(self.source_trials) if experiment == "early" else []


def test_the_controller_records_the_sources_and_seeds_a_restart_with_the_same_trials():
    spec = make_spec(warmStart={"experiments": ["early"]}, searchSpace={"x": {"uniform": [0, 1]}})
    store = Sources([trial(0, "Succeeded", loss=0.5), trial(1, "Running")])

    def controller() -> ExperimentController:
        return ExperimentController(namespace="ns", name="late", store=store, registry=None,
                                    body=lambda: {"metadata": {"name": "late", "uid": "u"}})

    first = controller()
    warm, notes = asyncio.run(first.intake.warm_start(spec, {}))
    assert [w.source for w in warm] == ["early/early-0"] and notes == []
    status = {"warmStartSources": first.status.warm_sources}
    # what the Experiment's status carries, whole, beside the rest
    from kubetune.core.types import ExperimentSummary
    written = render.experiment_status(ExperimentSummary(counts={}, created=0), total=1, previous={}, generation=1,
                                       now=0.0, suspended=False, kept=status)
    assert written["warmStartSources"] == first.status.warm_sources
    store.source_trials = [trial(0, "Succeeded", loss=0.5), trial(1, "Succeeded", loss=0.1)]
    warm, notes = asyncio.run(controller().intake.warm_start(spec, json.loads(json.dumps(written))))
    assert [w.source for w in warm] == ["early/early-0"] and notes == []     # not early-1: not used before
