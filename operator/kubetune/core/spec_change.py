"""What of a spec edited while the Experiment runs (GitOps) is taken.

Budgets, suspend, priority and the trial template take effect; what the study and the
scheduler were built on cannot change, nor can maxTrials drop below the trials already
created: those parts keep their old values, and the problems say why.  Pure."""
from __future__ import annotations

import dataclasses

from kubetune.spec.model import ExperimentSpec


def accept_spec_change(old: ExperimentSpec, new: ExperimentSpec, created: int) -> tuple[ExperimentSpec, list[str]]:
    """The spec to run with, and what of ``new`` was refused (each naming its field)."""
    problems = []
    for path, before, after in (("spec.objective.metric", old.objective.metric, new.objective.metric),
                                ("spec.objective.mode", old.objective.mode, new.objective.mode),
                                ("spec.objectives", old.objectives, new.objectives),
                                ("spec.constraints", old.constraints, new.constraints),
                                ("spec.warmStart", old.warm_start, new.warm_start),
                                ("spec.searchSpace", old.search_space, new.search_space),
                                ("spec.search", old.search, new.search),
                                ("spec.scheduler", old.scheduler, new.scheduler)):
        if before != after:
            problems.append(f"{path}: cannot change while the experiment runs; create a new Experiment")
    budget = new.budget
    if budget.max_trials < created:
        problems.append(f"spec.budget.maxTrials: cannot lower to {budget.max_trials}: {created} "
                        f"trials already exist; set it to {created} or more")
        budget = dataclasses.replace(budget, max_trials=old.budget.max_trials)
    spec = dataclasses.replace(
        new, objective=dataclasses.replace(new.objective, metric=old.objective.metric, mode=old.objective.mode),
        objectives=old.objectives, constraints=old.constraints, warm_start=old.warm_start,
        reference_point=old.reference_point,
        search_space=old.search_space, search=old.search, scheduler=old.scheduler, budget=budget)
    return spec, problems
