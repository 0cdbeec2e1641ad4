"""What the parts of one Experiment's controller share: who it is, where it writes,
the spec and runner it drives, and the platform its trials run on.

``ExperimentController`` (experiment.py) coordinates four parts around this context,
each with one job: ``SpecIntake`` (intake.py: parse, validate, restore, warm start),
``EffectQueue`` (effects.py: carry out the runner's decisions, retried),
``ResultPump`` (result_pump.py: platform -> runner -> results store) and
``StatusWriter`` (status_writer.py: render, coalesce, write)."""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping

from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.controller.store import Store
from kubetune.core.failures import FailureKind
from kubetune.core.runner import TrialRunner
from kubetune.executors.platform import Platform, PlatformRegistry
from kubetune.spec import ExperimentSpec
from kubetune.spec.trial_key import TrialKey

log = logging.getLogger("kubetune.controller.experiment")


@dataclasses.dataclass
class ExperimentContext:
    namespace: str
    name: str
    store: Store
    registry: PlatformRegistry
    body: Callable[[], Mapping[str, Any]]
    clock: Callable[[], float]
    default_storage: str = ""                   # checkpoint storage when the spec names none
    # every accepted result and failed attempt also goes to the results store
    # (kubetune.results); Trial and Experiment metadata follow the status writes
    results: ResultsRecorder | None = None
    spec: ExperimentSpec | None = None          # the last spec taken (valid and allowed)
    runner: TrialRunner | None = None           # None until a spec was taken (or restored)
    platform: Platform | None = None            # where its trials run, chosen with the first spec
    generation: int | None = None               # metadata.generation of ``spec``
    # trials whose status may have changed since it was last written
    touched: set[str] = dataclasses.field(default_factory=set)

    def trial_key(self, trial: str) -> str:
        return str(TrialKey(self.namespace, self.name, trial))

    @property
    def prefix(self) -> str:
        """The key prefix of every trial of this Experiment."""
        return self.trial_key("")

    def storage(self, spec: ExperimentSpec | None = None) -> str:
        return (spec or self.spec).checkpoint.storage or self.default_storage

    def platform_fault(self, error: BaseException) -> bool:
        """The platform, not the trial, failed: the platform knows its own errors."""
        return self.platform is not None and self.platform.classify(error) is FailureKind.PLATFORM

    async def trial_event(self, trial: str, reason: str, message: str) -> None:
        """Post a Warning Event on one Trial; a failure is logged (an Event is a courtesy)."""
        try:
            await self.store.trial_event(trial, "Warning", reason, message[:1000])
        except Exception as error:  # noqa: BLE001 - an Event is a courtesy
            log.warning("%s/%s: event %s on %s not posted: %s", self.namespace, self.name, reason, trial, error)

    async def event(self, kind: str, reason: str, message: str) -> None:
        """Post an Event on the Experiment; a failure is logged (an Event is a courtesy)."""
        try:
            await self.store.event(kind, reason, message)
        except Exception as error:  # noqa: BLE001 - an Event is a courtesy
            log.warning("%s/%s: event %s not posted: %s", self.namespace, self.name, reason, error)
