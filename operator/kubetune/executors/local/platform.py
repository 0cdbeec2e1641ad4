"""The local platform: trials as processes of the host that runs ``kubetune run``.

``LocalPlatform`` is the ``Platform`` (executors/platform.py) over ``LocalExecutor``:
its ledger holds this host's CPUs, so no more trials run at once than it has cores
for, and one that asks for a GPU fails at once, naming it; there is no connection to
lose and no driver process.  ``LocalPlatforms`` is its ``PlatformProvider``, the one
platform of ``kubetune run --platform local``, which registers it for the
Experiments a Ray cluster would run (``spec.executor: ray``: a Python function)::

    PlatformRegistry({"ray": LocalPlatforms()})
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from kubetune.core.resources import ResourceLedger, Resources
from kubetune.executors.local.executor import LocalExecutor
from kubetune.executors.platform import ExecutorPlatform
from kubetune.spec.model import ExperimentSpec


class LocalPlatform(ExecutorPlatform):
    address = "local"
    lost_run_message = "the trial's process is gone"

    def __init__(self, executor: LocalExecutor | None = None) -> None:
        self.executor = executor or LocalExecutor()
        self.ledger = ResourceLedger()
        self.last_error = ""

    @property
    def connected(self) -> bool:
        return self.ledger.capacity_known

    async def ensure_connected(self) -> bool:
        if not self.ledger.capacity_known:
            await self.refresh_capacity()
        return True

    def mark_unavailable(self, error: BaseException | str) -> None:
        self.last_error = str(error)

    async def refresh_capacity(self) -> None:
        capacity = self.executor.cluster_resources()
        self.ledger.set_capacity(Resources.from_ray(capacity.total))

    async def end_runs(self, prefix: str) -> bool:
        await asyncio.to_thread(self.executor.stop_all, prefix)
        return True

    async def end_all(self, prefix: str) -> int:
        return await asyncio.to_thread(self.executor.stop_all, prefix)

    async def release(self, trial_keys: list[str]) -> None:
        for key in trial_keys:
            self.ledger.release(key)


class LocalPlatforms:
    """The ``PlatformProvider`` of ``kubetune run --platform local``: one ``LocalPlatform``."""

    def __init__(self, platform: LocalPlatform | None = None) -> None:
        self.platform = platform or LocalPlatform()

    def platform_for(self, spec: ExperimentSpec, namespace: str = "") -> LocalPlatform:
        return self.platform

    def cleanup_platform(self, spec: Mapping[str, Any], namespace: str = "") -> LocalPlatform:
        return self.platform

    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]:
        return []

    def platforms(self) -> list[LocalPlatform]:
        return [self.platform]

    async def retire_idle(self, in_use: set[str]) -> list[str]:
        return []
