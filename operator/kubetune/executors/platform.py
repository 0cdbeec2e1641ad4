"""The platform seam: what the controller holds for one Experiment, whatever runs its trials.

A ``Platform`` is one place trials run (a Ray cluster, the pods of a Kubernetes
cluster): it launches, polls, stops and pauses trials (through its ``TrialExecutor``,
in a thread), keeps the capacity ledger and its demand, says what a waiting trial is
waiting for, tells a platform's fault from a trial's, and owns its connection (a
driver process, an API client).  One implementation per executor package
(``executors/ray/platform.py``, ``executors/pods/cluster.py``); ``PlatformRegistry``
picks one by ``spec.executor``, as ``core/schedulers`` picks a scheduler by
``spec.scheduler.type``.  The controller holds a ``Platform`` and never asks which one.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Protocol

from kubetune.core.failures import FailureKind
from kubetune.core.resources import ResourceLedger
from kubetune.executors.base import (ExecutorError, LaunchInfo, LaunchRequest, PlatformUnavailableError,
                                     TrialExecutor, TrialUpdate)
from kubetune.spec.model import ExperimentSpec


class PlatformRefused(ExecutorError):
    """A platform this operator will not use for an Experiment (its own failure, not the
    platform's): an address it does not connect to, or an executor it does not offer.
    ``reason`` is the Experiment's condition reason; the message says what to change."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Platform(Protocol):
    address: str                 # where it runs trials, as shown in messages and metrics
    ledger: ResourceLedger       # shared by every Experiment on it
    last_error: str              # why it cannot be used now; "" when it can
    retired: bool                # its connection was ended for want of use (not an outage)
    unavailable_condition: str   # the Experiment condition type that shows ``last_error``
    lost_run_message: str        # a trial's error when its run vanished without a word
    # its connection is ended when no Experiment needs it (``PlatformRegistry.retire_idle``),
    # so a finished Experiment makes no call on it until a spec change reopens it
    idle_connection_ends: bool

    @property
    def connected(self) -> bool: ...
    async def ensure_connected(self) -> bool:
        """Connect if needed; False (with ``last_error`` set) while it cannot be reached."""
    def mark_unavailable(self, error: BaseException | str) -> None: ...
    async def refresh_capacity(self) -> None: ...
    def classify(self, error: BaseException) -> FailureKind:
        """Whose fault ``error`` (raised by a call here) is: ``PLATFORM`` means reconnect and
        keep the trial (its failure is not counted), ``TRIAL`` that the trial failed."""
    def launch_waiting(self, request: LaunchRequest) -> tuple[str, str] | None:
        """What a trial launched with ``request`` waits for before it runs, if known at once."""
    def shown_waiting(self, reason: str, message: str, evictions: int, since_eviction: bool) -> tuple[str, str]:
        """The reason and message a waiting trial shows (e.g. after being preempted)."""
    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]: ...
    async def start(self, request: LaunchRequest) -> LaunchInfo: ...
    async def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0) -> dict[str, TrialUpdate]: ...
    async def stop(self, trial_key: str) -> TrialUpdate | None: ...   # its final answer, if any
    async def pause(self, trial_key: str, *, after_seq: int | None) -> TrialUpdate | None: ...
    async def list_trials(self, prefix: str) -> list[str]: ...
    async def end_runs(self, prefix: str) -> bool:
        """A finished Experiment's leftovers: end every run under ``prefix`` and withdraw its
        demand; True once that holds (False: try again next cycle)."""
    async def end_all(self, prefix: str) -> int:
        """The Experiment is deleted: end every run under ``prefix``; how many are still alive."""
    async def release(self, trial_keys: list[str]) -> None:
        """Give back what ``trial_keys`` held, and the demand they stood for."""


class ExecutorPlatform:
    """The part every platform shares: its ``TrialExecutor``'s blocking calls go to a
    thread, and errors the executor says mean "unreachable" are the platform's fault."""

    executor: TrialExecutor | None    # None until connected (a platform may make it lazily)
    unavailable_condition = "RayUnavailable"    # the condition's historic name, kept for every platform
    lost_run_message = "trial's run is gone"
    idle_connection_ends = False
    retired = False

    def classify(self, error: BaseException) -> FailureKind:
        if isinstance(error, (ConnectionError, PlatformUnavailableError)):
            return FailureKind.PLATFORM
        executor = self.executor
        if executor is not None and executor.is_unavailable(error):
            return FailureKind.PLATFORM
        return FailureKind.TRIAL

    def launch_waiting(self, request: LaunchRequest) -> tuple[str, str] | None:
        return None

    def shown_waiting(self, reason: str, message: str, evictions: int, since_eviction: bool) -> tuple[str, str]:
        return reason, message

    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]:
        return []

    async def in_thread(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)`` (a blocking executor call) in a thread: the event
        loop's default pool unless the platform keeps threads of its own."""
        return await asyncio.to_thread(call, *args, **kwargs)

    async def start(self, request: LaunchRequest) -> LaunchInfo:
        return await self.in_thread(self.executor.start, request)

    async def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0) -> dict[str, TrialUpdate]:
        return await self.in_thread(self.executor.poll, cursors, wait_s=wait_s)

    async def stop(self, trial_key: str) -> TrialUpdate | None:
        return await self.in_thread(self.executor.stop, trial_key)

    async def pause(self, trial_key: str, *, after_seq: int | None) -> TrialUpdate | None:
        return await self.in_thread(self.executor.pause, trial_key, after_seq=after_seq)

    async def list_trials(self, prefix: str) -> list[str]:
        return await self.in_thread(self.executor.list_trials, prefix)


class PlatformProvider(Protocol):
    """Operator-wide, one per executor package: the platform of each Experiment."""

    def platform_for(self, spec: ExperimentSpec, namespace: str) -> Platform:
        """The platform of an Experiment of ``namespace``; raises ``PlatformRefused`` for
        one this operator does not use for it (before any connection)."""
    def cleanup_platform(self, spec: Mapping[str, Any], namespace: str) -> Platform | None:
        """Where a deleted Experiment's runs must be ended (``spec``: as stored, maybe
        invalid); None when nothing needs ending there (nothing ran, or the garbage
        collector ends them with the Trials)."""
    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]: ...
    def platforms(self) -> list[Platform]: ...
    async def retire_idle(self, in_use: set[str]) -> list[str]: ...


DEFAULT_EXECUTOR = "ray"     # spec.executor when the Experiment names none (spec/parse.py)


class PlatformRegistry:
    """The platform providers this operator offers, by ``spec.executor``.  One that is
    absent is refused with ``refusals[name]`` (why it is off and how to turn it on)."""

    def __init__(self, providers: Mapping[str, PlatformProvider], refusals: Mapping[str, str] | None = None) -> None:
        self.providers = dict(providers)
        self.refusals = dict(refusals or {})

    def _provider(self, executor: str) -> PlatformProvider:
        if executor not in self.providers:
            raise PlatformRefused(f"{executor.capitalize()}ExecutorUnavailable", self.refusals.get(
                executor, f"executor: {executor} is not offered by this operator"))
        return self.providers[executor]

    def platform_for(self, spec: ExperimentSpec, namespace: str) -> Platform:
        return self._provider(spec.executor).platform_for(spec, namespace)

    def cleanup_platform(self, spec: Mapping[str, Any], namespace: str) -> Platform | None:
        provider = self.providers.get(spec.get("executor") or DEFAULT_EXECUTOR)
        return provider.cleanup_platform(spec, namespace) if provider is not None else None

    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]:
        provider = self.providers.get(spec.executor)
        return await provider.policy_violations(namespace, spec) if provider is not None else []

    def platforms(self) -> list[Platform]:
        return [platform for provider in self.providers.values() for platform in provider.platforms()]

    async def retire_idle(self, in_use: set[str]) -> list[str]:
        """End the connections (driver processes) no Experiment has needed for a while;
        ``in_use``: the addresses some Experiment needs now.  Returns those it ended."""
        retired = []
        for provider in self.providers.values():
            retired += await provider.retire_idle(in_use)
        return retired
