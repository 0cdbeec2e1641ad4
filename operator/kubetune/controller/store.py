"""Where an ExperimentController persists what it decided.

Two implementations: ``k8s.store.KubeStore`` (Trial and Experiment resources — the
operator) and ``MemoryStore`` below (``kubetune run`` on a laptop).  The controller
only ever talks to this protocol, so both paths run the very same loop.
"""
from __future__ import annotations

import uuid
from typing import Any, Mapping, Protocol

from kubetune.controller.merge_patch import apply_merge_patch


class Store(Protocol):
    async def list_trials(self) -> list[dict[str, Any]]:
        """Every Trial object of this experiment (full bodies, with status)."""

    async def list_trials_of(self, experiment: str) -> list[dict[str, Any]]:
        """The Trials of another Experiment in the same namespace (warm start)."""

    async def create_trial(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Trial; if one of that name exists already, return it (idempotent)."""

    async def patch_trial_status(self, name: str, status: Mapping[str, Any]) -> None:
        """Write a Trial's status; raises ``k8s.errors.WriteRefused``."""

    async def patch_experiment_status(self, status: Mapping[str, Any]) -> None:
        """Write the Experiment's status; raises ``k8s.errors.WriteRefused``."""

    async def strip_managed_fields(self, trial: str) -> None:
        """Drop a finished Trial's ``metadata.managedFields`` (controller/managed_fields.py);
        raises ``k8s.errors.WriteRefused``."""

    async def event(self, kind: str, reason: str, message: str) -> None:
        """Record something a human should see (Kubernetes Event; a log line locally)."""

    async def trial_event(self, trial: str, kind: str, reason: str, message: str) -> None:
        """The same, about one Trial (an Event on the Trial)."""


class MemoryStore:
    """In-process store for ``kubetune run``: the same shapes, held in dicts."""

    def __init__(self, on_event=None) -> None:
        self.trials: dict[str, dict[str, Any]] = {}
        self.experiment_status: dict[str, Any] = {}
        self.writes = 0
        self._on_event = on_event

    async def list_trials(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.trials.values()]

    async def list_trials_of(self, experiment: str) -> list[dict[str, Any]]:
        return []      # a local run has no earlier Experiments

    async def create_trial(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name not in self.trials:
            self.writes += 1
            # a UID as the API server gives one: the results store keys trials by it
            metadata = {**body["metadata"], "uid": str(uuid.uuid4())}
            self.trials[name] = {**body, "metadata": metadata, "status": dict(body.get("status") or {})}
        return self.trials[name]

    async def patch_trial_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.writes += 1
        apply_merge_patch(self.trials[name]["status"], status)

    async def patch_experiment_status(self, status: Mapping[str, Any]) -> None:
        self.writes += 1
        apply_merge_patch(self.experiment_status, status)

    async def strip_managed_fields(self, trial: str) -> None:
        pass     # no API server: nothing records which manager wrote which field

    async def event(self, kind: str, reason: str, message: str) -> None:
        if self._on_event is not None:
            self._on_event(kind, reason, message)

    async def trial_event(self, trial: str, kind: str, reason: str, message: str) -> None:
        await self.event(kind, reason, message)
