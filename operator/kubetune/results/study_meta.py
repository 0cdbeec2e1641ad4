"""The ``study`` column of an Experiment's row: what a study view (``kubetune
dashboard``) needs beyond the row's one metric — every objective with its mode, the
constraints, the search space as Optuna distributions — as JSON.  Written by the
operator and ``kubetune run`` from the parsed spec; read by kubetune.dashboard.study."""
from __future__ import annotations

import json
from typing import Iterable, Mapping

from optuna.distributions import BaseDistribution, distribution_to_json

from kubetune.spec.model import Constraint, ExperimentSpec


# the dashboard's address of an Experiment's page (a redirect to its study): what
# status.dashboard names when the operator knows the dashboard's base URL
EXPERIMENT_PATH = "/experiments/{namespace}/{name}"


def experiment_link(base_url: str, namespace: str, name: str) -> str:
    return base_url.rstrip("/") + EXPERIMENT_PATH.format(namespace=namespace, name=name)


def study_json(objectives: Iterable[tuple[str, str]], constraints: Iterable[Constraint],
               distributions: Mapping[str, BaseDistribution]) -> str:
    return json.dumps({
        "objectives": [{"metric": m, "mode": mode} for m, mode in objectives],
        "constraints": [{"metric": c.metric, "min": c.min, "max": c.max} for c in constraints],
        "distributions": {name: distribution_to_json(d) for name, d in distributions.items()},
    }, sort_keys=True)


def from_spec(spec: ExperimentSpec) -> str:
    from kubetune.core.samplers import shown_distribution
    return study_json([(o.metric, o.mode) for o in spec.objectives], spec.constraints,
                      {name: shown_distribution(param) for name, param in spec.search_space.items()})
