"""Trial schedulers: one per file behind ``base.TrialScheduler``; ``make_scheduler``
picks the one an Experiment's ``spec.scheduler.type`` names.  Each file's scheduler
class says its ``name`` (and which objectives it judges); this package finds them by
importing its modules, so adding one is its file and its test (CONTRIBUTING.md).
Pure, like the rest of core/."""
from __future__ import annotations

import importlib
import pkgutil

from kubetune.core.schedulers.base import CONTINUE, Action, SchedulerDecision, TrialScheduler
from kubetune.core.search import Searcher
from kubetune.spec.model import ExperimentSpec, SpecError

DEFAULT = "fifo"    # spec.scheduler.type when the Experiment names none (spec/parse.py)


def _discover() -> list[type[TrialScheduler]]:
    """Every scheduler class that sets ``name`` in its own body, in this package's modules."""
    found = []
    for module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
        loaded = importlib.import_module(f"{__name__}.{module}")
        found += [value for value in vars(loaded).values()
                  if isinstance(value, type) and issubclass(value, TrialScheduler)
                  and value.__module__ == loaded.__name__ and value.__dict__.get("name")]
    return found


def _table(kind: str) -> dict[str, type[TrialScheduler]]:
    table: dict[str, type[TrialScheduler]] = {}
    for cls in _discover():
        if kind in cls.objectives:
            if cls.name in table:
                raise RuntimeError(f"two {kind}-objective schedulers named {cls.name!r}: "
                                   f"{table[cls.name].__name__} and {cls.__name__}")
            table[cls.name] = cls
    # the default first, then by name: the order of "use one of" lists
    return dict(sorted(table.items(), key=lambda item: (item[0] != DEFAULT, item[0])))


SCHEDULERS = _table("single")
MULTI_OBJECTIVE_SCHEDULERS = _table("multi")    # with several objectives


def scheduler_class(spec: ExperimentSpec) -> type[TrialScheduler]:
    """The scheduler ``spec`` names; ``SpecError`` when there is none of that name for
    its objectives or it lacks what the scheduler needs (an unknown name is an error,
    never a default)."""
    kind = spec.scheduler.type
    table = MULTI_OBJECTIVE_SCHEDULERS if spec.multi_objective else SCHEDULERS
    if kind not in table:
        if spec.multi_objective and kind in SCHEDULERS:
            raise SpecError("spec.scheduler.type", f"the {kind} scheduler judges trials on one objective only; "
                                                   f"with several objectives use {' or '.join(table)} "
                                                   "(asha: MO-ASHA)")
        raise SpecError("spec.scheduler.type", f"unknown scheduler {kind!r}; use one of: {', '.join(table)}")
    cls = table[kind]
    if cls.requires_max_iterations and spec.scheduler.max_iterations is None:
        raise SpecError("spec.scheduler.maxIterations",
                        f"required for {kind}: the per-trial iteration cap, e.g. maxIterations: 100")
    return cls


def make_scheduler(spec: ExperimentSpec, searcher: Searcher) -> TrialScheduler:
    return scheduler_class(spec)(spec, searcher)


__all__ = ["make_scheduler", "scheduler_class", "TrialScheduler", "SchedulerDecision", "Action", "CONTINUE",
           "SCHEDULERS", "MULTI_OBJECTIVE_SCHEDULERS", "DEFAULT"]
