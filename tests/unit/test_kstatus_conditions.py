"""Ready / Reconciling / Stalled (kstatus conventions, issue 33) follow the phase alone,
in every path that writes an Experiment's status."""
from __future__ import annotations

import pytest

from kubetune.controller import render
from kubetune.controller.conditions import kstatus_conditions
from kubetune.core.types import ExperimentSummary, FinishExperiment, TrialPhase


def by_type(conditions):
    return {c["type"]: c for c in conditions}


@pytest.mark.parametrize("phase, ready, reconciling, stalled", [
    ("Pending", "False", "True", "False"),
    ("Queued", "False", "True", "False"),
    ("Running", "False", "True", "False"),
    ("Suspended", "False", "False", "False"),
    ("Succeeded", "True", "False", "False"),
    ("Failed", "False", "False", "True"),
])
def test_each_phase_sets_exactly_its_kstatus_conditions(phase, ready, reconciling, stalled):
    conditions = by_type(kstatus_conditions([], phase, "Why", "what happened", now=10.0, generation=3))
    assert {t: c["status"] for t, c in conditions.items()} == {
        "Ready": ready, "Reconciling": reconciling, "Stalled": stalled}
    assert all(c["observedGeneration"] == 3 and c["reason"] == "Why" and c["message"] == "what happened"
               for c in conditions.values())


def test_a_transition_moves_only_the_conditions_that_flip():
    running = kstatus_conditions([], "Running", "TrialsRunning", "", now=10.0, generation=1)
    done = by_type(kstatus_conditions(running, "Succeeded", "MaxTrialsReached", "done", now=20.0, generation=1))
    assert done["Ready"]["status"] == "True" and done["Ready"]["lastTransitionTime"].startswith("1970-01-01T00:00:20")
    assert done["Stalled"]["lastTransitionTime"].startswith("1970-01-01T00:00:10")   # False before and after


def summary(**fields):
    return ExperimentSummary(counts={p.value: 0 for p in TrialPhase}, created=1, **fields)


@pytest.mark.parametrize("fields, suspended, blocked, expected", [
    ({}, False, None, ("Running", "True", "False", "False")),
    ({"finished": FinishExperiment("Succeeded", "MaxTrialsReached", "done")}, False, None,
     ("Succeeded", "False", "True", "False")),
    ({"finished": FinishExperiment("Failed", "MaxFailedTrialsReached", "3 failed")}, False, None,
     ("Failed", "False", "False", "True")),
    ({}, True, None, ("Suspended", "False", "False", "False")),
    ({}, False, ("Forbidden", "missing permission"), ("Failed", "False", "False", "True")),
])
def test_the_experiment_status_carries_them_with_the_phase(fields, suspended, blocked, expected):
    status = render.experiment_status(summary(**fields), total=2, previous={}, generation=4, now=0.0,
                                      suspended=suspended, blocked=blocked)
    conditions = by_type(status["conditions"])
    assert (status["phase"], conditions["Reconciling"]["status"], conditions["Ready"]["status"],
            conditions["Stalled"]["status"]) == expected
    assert status["observedGeneration"] == 4


def test_a_spec_refused_at_start_is_stalled_with_its_reason():
    status = render.refused_status({}, "InvalidSpec", "spec.searchSpace.x: no grid", now=0.0, generation=2)
    stalled = by_type(status["conditions"])["Stalled"]
    assert status["phase"] == "Failed" and status["observedGeneration"] == 2
    assert (stalled["status"], stalled["reason"], stalled["message"]) == (
        "True", "InvalidSpec", "spec.searchSpace.x: no grid")
