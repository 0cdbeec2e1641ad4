"""KubeStore: the controller's Store on a real API server (Trial and Experiment
resources, Events).  The blocking client runs in threads; every write is one call."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from kubernetes.client.exceptions import ApiException

from kubetune import metrics
from kubetune.k8s.client import EXPERIMENT_LABEL, EXPERIMENTS, GROUP, TRIALS, VERSION, custom_objects

log = logging.getLogger(__name__)


class KubeStore:
    def __init__(self, namespace: str, experiment: str,
                 post_event: Callable[[str, str, str], None] | None = None) -> None:
        self.namespace = namespace
        self.experiment = experiment
        self._api = custom_objects()
        self._post_event = post_event
        self.writes = 0

    async def list_trials(self) -> list[dict[str, Any]]:
        return await self.list_trials_of(self.experiment)

    async def list_trials_of(self, experiment: str) -> list[dict[str, Any]]:
        listing = await asyncio.to_thread(
            self._api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, TRIALS,
            label_selector=f"{EXPERIMENT_LABEL}={experiment}")
        return listing["items"]

    async def create_trial(self, body: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        metrics.api_write("trials", "create")
        try:
            return await asyncio.to_thread(
                self._api.create_namespaced_custom_object, GROUP, VERSION, self.namespace, TRIALS, body)
        except ApiException as error:
            if error.status != 409:
                raise
            # created by an earlier attempt (retry or restart): the deterministic name makes it ours
            return await asyncio.to_thread(
                self._api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, TRIALS,
                body["metadata"]["name"])

    async def patch_trial_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.writes += 1
        metrics.api_write("trials", "patch_status")
        try:
            await asyncio.to_thread(
                self._api.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace, TRIALS,
                name, {"status": dict(status)})
        except ApiException as error:
            if error.status != 404:   # deleted under us (Experiment deletion): nothing to record
                raise

    async def patch_experiment_status(self, status: Mapping[str, Any]) -> None:
        self.writes += 1
        metrics.api_write("experiments", "patch_status")
        try:
            await asyncio.to_thread(
                self._api.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace,
                EXPERIMENTS, self.experiment, {"status": dict(status)})
        except ApiException as error:
            if error.status != 404:
                raise

    async def event(self, kind: str, reason: str, message: str) -> None:
        if self._post_event is not None:
            self._post_event(kind, reason, message)
            metrics.event_posted(kind, reason)
