"""kopf registration only: every handler routes to controller.operator_state."""
from __future__ import annotations

import logging
import os

import kopf

from kubetune.controller.clusters import ClusterRegistry
from kubetune.controller.operator_state import OperatorState
from kubetune.k8s.client import EXPERIMENTS, GROUP, VERSION, load_config
from kubetune.k8s.store import KubeStore

STATE: OperatorState | None = None


def _executor_factory(address: str):
    from kubetune.executors.ray import RayExecutor   # Ray is imported only when needed
    return RayExecutor(address)


def _event_poster(body):
    def post(kind: str, reason: str, message: str) -> None:
        kopf.event(body, type=kind, reason=reason, message=message)
    return post


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_) -> None:
    global STATE
    load_config()
    settings.persistence.finalizer = "kubetune.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kubetune.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kubetune.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING   # our own Events only; kopf's info logs stay in the log
    settings.watching.server_timeout = 300
    registry = ClusterRegistry(os.environ.get("KUBETUNE_RAY_ADDRESS", "local"), _executor_factory)
    STATE = OperatorState(
        registry,
        store_factory=lambda namespace, name, body: KubeStore(namespace, name, _event_poster(body)),
        checkpoint_storage=os.environ.get("KUBETUNE_CHECKPOINT_STORAGE", ""))


@kopf.daemon(GROUP, VERSION, EXPERIMENTS, cancellation_timeout=30.0)
async def run_experiment(namespace: str, name: str, body: kopf.Body, stopped: kopf.DaemonStopped, **_) -> None:
    controller = STATE.controller_for(namespace, name, body)
    await controller.run(stopped.is_set)


@kopf.on.update(GROUP, VERSION, EXPERIMENTS, field="spec")
async def spec_changed(namespace: str, name: str, **_) -> None:
    STATE.wake(namespace, name)


@kopf.on.delete(GROUP, VERSION, EXPERIMENTS)
async def experiment_deleted(namespace: str, name: str, **_) -> None:
    await STATE.delete(namespace, name)
