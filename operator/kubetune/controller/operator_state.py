"""Operator-wide state: the cluster registry and one ExperimentController per
Experiment.  kopf handlers (handlers.py) only route events here."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from kubetune.controller.clusters import ClusterRegistry
from kubetune.controller.experiment import ExperimentController
from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.results.writer import ResultsWriter

log = logging.getLogger(__name__)


class OperatorState:
    def __init__(self, registry: ClusterRegistry, store_factory: Callable[[str, str, Mapping[str, Any]], Any],
                 checkpoint_storage: str, results: ResultsWriter | None = None) -> None:
        self.registry = registry
        self.results = results   # the results store's writer, shared by every Experiment
        self._store_factory = store_factory
        self._checkpoint_storage = checkpoint_storage
        self.controllers: dict[tuple[str, str], ExperimentController] = {}

    def controller_for(self, namespace: str, name: str, body: Mapping[str, Any]) -> ExperimentController:
        key = (namespace, name)
        if key not in self.controllers:
            self.controllers[key] = ExperimentController(
                namespace=namespace, name=name, store=self._store_factory(namespace, name, body),
                registry=self.registry, body=lambda: body, checkpoint_storage=self._checkpoint_storage,
                results=ResultsRecorder(self.results, namespace, lambda: body) if self.results is not None else None)
        return self.controllers[key]

    def wake(self, namespace: str, name: str) -> None:
        controller = self.controllers.get((namespace, name))
        if controller is not None:
            controller.wake()

    def forget(self, namespace: str, name: str) -> None:
        self.controllers.pop((namespace, name), None)

    async def delete(self, namespace: str, name: str) -> None:
        """The Experiment is being deleted: end its trials on Ray (Trials go by GC)."""
        controller = self.controllers.pop((namespace, name), None)
        if controller is not None:
            await controller.shutdown(stop_trials=True)
            return
        # no controller in this process (e.g. deleted while the operator was down)
        for handle in self.registry.handles():
            if handle.executor is not None:
                await asyncio.to_thread(handle.executor.stop_all, f"{namespace}/{name}/")
