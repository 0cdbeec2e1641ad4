"""Trial schedulers: one per file behind ``base.TrialScheduler``; ``make_scheduler``
picks the one an Experiment's ``spec.scheduler.type`` names.  Adding one: see
CONTRIBUTING.md.  Pure, like the rest of core/."""
from __future__ import annotations

from kubetune.core.schedulers.asha import ASHAScheduler
from kubetune.core.schedulers.base import CONTINUE, Action, SchedulerDecision, TrialScheduler
from kubetune.core.schedulers.fifo import FIFOScheduler
from kubetune.core.schedulers.hyperband import HyperBandScheduler
from kubetune.core.schedulers.median import MedianStoppingScheduler
from kubetune.core.schedulers.mo_asha import MOASHAScheduler
from kubetune.core.schedulers.pbt import PBTScheduler
from kubetune.core.schedulers.percentile import PercentileStoppingScheduler
from kubetune.core.search import Searcher
from kubetune.spec.model import ExperimentSpec, SpecError

SCHEDULERS: dict[str, type[TrialScheduler]] = {
    "fifo": FIFOScheduler, "asha": ASHAScheduler, "hyperband": HyperBandScheduler,
    "median": MedianStoppingScheduler, "percentile": PercentileStoppingScheduler, "pbt": PBTScheduler,
}


# with several objectives (spec/ refuses the types missing here)
MULTI_OBJECTIVE_SCHEDULERS: dict[str, type[TrialScheduler]] = {"fifo": FIFOScheduler, "asha": MOASHAScheduler}


def make_scheduler(spec: ExperimentSpec, searcher: Searcher) -> TrialScheduler:
    table = MULTI_OBJECTIVE_SCHEDULERS if spec.multi_objective else SCHEDULERS
    if spec.scheduler.type not in table:   # an unknown name is an error, never a default
        raise SpecError("spec.scheduler.type",
                        f"unknown scheduler {spec.scheduler.type!r}; use one of: {', '.join(table)}")
    return table[spec.scheduler.type](spec, searcher)


__all__ = ["make_scheduler", "TrialScheduler", "SchedulerDecision", "Action", "CONTINUE", "SCHEDULERS",
           "FIFOScheduler", "ASHAScheduler", "MOASHAScheduler", "HyperBandScheduler", "MedianStoppingScheduler",
           "PercentileStoppingScheduler", "PBTScheduler"]
