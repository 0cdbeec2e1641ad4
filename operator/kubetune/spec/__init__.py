"""The Experiment data model: parse and validate Experiment CR specs (pure, no I/O).

``parse.py`` reads a spec part by part, ``fields.py`` one field (its type, bounds and the
error naming it), ``search_space.py`` the search space, ``objectives.py`` what is
optimised and already known; ``model.py`` is what they build.

``results.py``: what a reported result may hold, and ``Result`` with its one wire
format (``to_wire``/``from_wire``), shared by every collector and executor.

May import: nothing of kubetune outside spec/ (tests/unit/test_purity.py); the CRD
(crds/experiment.yaml) and this package agree on enums, defaults and bounds
(tests/unit/test_crd_matches_spec.py)."""
from kubetune.spec.model import (
    Budget, CheckpointSpec, ExperimentSpec, Objective, Param, RaySpec, SchedulerSpec, SearchSpec,
    SpecError, TrialResources, TrialTemplate,
)
from kubetune.spec.parse import parse_experiment
from kubetune.spec.quantities import format_memory, parse_duration, parse_memory

__all__ = [
    "parse_experiment", "SpecError", "ExperimentSpec", "Objective", "Param", "SearchSpec",
    "SchedulerSpec", "Budget", "TrialTemplate", "TrialResources", "CheckpointSpec", "RaySpec",
    "parse_duration", "parse_memory", "format_memory",
]
