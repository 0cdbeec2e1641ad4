"""Operator-wide state: the platform registry and one ExperimentController per
Experiment.  kopf handlers (handlers.py) only route events here."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from kubetune.controller.experiment import ExperimentController
from kubetune.controller.results_recorder import ResultsRecorder
from kubetune.executors.platform import Platform, PlatformRegistry
from kubetune.results.writer import ResultsWriter

log = logging.getLogger(__name__)

REST_CHECK_SECONDS = 5.0   # a finished Experiment at rest looks for a new generation this often (and on a spec event)


class CleanupPending(Exception):
    """An Experiment's trials are not all ended yet; the deletion is retried."""


class OperatorState:
    def __init__(self, registry: PlatformRegistry, store_factory: Callable[[str, str, Mapping[str, Any]], Any],
                 checkpoint_storage: str, results: ResultsWriter | None = None, dashboard_url: str = "") -> None:
        self.registry = registry
        self.results = results   # the results store's writer, shared by every Experiment
        self._store_factory = store_factory
        self._checkpoint_storage = checkpoint_storage
        self._dashboard_url = dashboard_url
        self.controllers: dict[tuple[str, str], ExperimentController] = {}
        self._uids: dict[tuple[str, str], str | None] = {}   # of the Experiment each controller serves
        self._deleting: dict[str, int] = {}    # platform address -> deletions cleaning up on it now
        # finished Experiments whose controller was let go (``serve``): their counts for the
        # metrics, and what wakes them on a spec change
        self.resting: dict[tuple[str, str], dict[str, Any]] = {}
        self._rest_wakeups: dict[tuple[str, str], asyncio.Event] = {}

    async def serve(self, namespace: str, name: str, body: Mapping[str, Any], stopped: Callable[[], bool]) -> None:
        """Run the Experiment's controller (the kopf daemon of ``body``, a live view) until
        ``stopped``.  A finished Experiment's controller goes once it is at rest (memory:
        a finished Experiment keeps nothing but its counts); a spec change (a new
        generation) brings a new one, restored from the Trials like after a restart."""
        key = (namespace, name)
        # from the moment kopf hands it over: Experiments applied (or restored) together
        # each get a first trial before any gets a second (core/fair_share.py)
        ledger = self._starting(namespace, name, body)

        def started() -> None:
            if ledger is not None:
                ledger.started(f"{namespace}/{name}/")

        def first_cycle_done(controller: ExperimentController) -> None:
            # it stops starting when it asks (ledger.watch, in the first cycle that reaches
            # its cluster: not one that found the cluster unreachable, or under load 30-50
            # the Experiments built first took a second trial each all the same); one that
            # will not ask (no runner: an invalid spec, finished before) stops now
            ctx = controller.ctx
            if ctx.runner is None or ctx.platform is None or ctx.platform.ledger is not ledger:
                started()
        try:
            await self._serve(key, body, stopped, first_cycle_done)
        finally:
            started()     # stopped, deleted, or gone to rest

    def _starting(self, namespace: str, name: str, body: Mapping[str, Any]) -> Any:
        """The ledger of the cluster a new Experiment will ask (its raw spec's), told it is
        starting.  Not one that ran before (a restart): its running trials are adopted as it
        is restored, two at a time, and holding everyone's second trial that long left the
        cluster idle (test_scale: waits of 120 completions of 200 instead of 43-86)."""
        if (body.get("status") or {}).get("startTime"):
            return None
        try:
            platform = self.registry.cleanup_platform(body.get("spec") or {}, namespace)
        except Exception:  # noqa: BLE001 - an invalid spec: its intake says why
            return None
        if platform is None:
            return None
        platform.ledger.starting(f"{namespace}/{name}/")
        return platform.ledger

    async def _serve(self, key: tuple[str, str], body: Mapping[str, Any], stopped: Callable[[], bool],
                     first_cycle_done: Callable[[ExperimentController], None]) -> None:
        namespace, name = key
        while not stopped():
            controller = self.controller_for(namespace, name, body)
            await controller.run(lambda: stopped() or controller.at_rest(), lambda: first_cycle_done(controller))
            if stopped() or controller.stopped_by_request or self.controllers.get(key) is not controller:
                return
            # the last word before it goes: a condition that cleared since the last cycle
            # (a results store back: ResultsStoreUnavailable False) is rendered from live
            # state, which resting drops; unwritten, the status would keep saying True
            await controller.status.flush(force=True)
            generation = (body.get("metadata") or {}).get("generation")
            status = controller.written_status
            self.resting[key] = {"phase": status.get("phase"), "trialCounts": dict(status.get("trialCounts") or {})}
            self.controllers.pop(key, None)
            del controller, status     # this frame must not keep the runner alive while it rests
            wakeup = self._rest_wakeups[key] = asyncio.Event()
            try:
                while not stopped() and (body.get("metadata") or {}).get("generation") == generation:
                    try:
                        await asyncio.wait_for(wakeup.wait(), timeout=REST_CHECK_SECONDS)
                    except asyncio.TimeoutError:
                        pass
                    wakeup.clear()
            finally:
                self._rest_wakeups.pop(key, None)
                self.resting.pop(key, None)

    def controller_for(self, namespace: str, name: str, body: Mapping[str, Any]) -> ExperimentController:
        key = (namespace, name)
        known = self.controllers.get(key)
        uid = (body.get("metadata") or {}).get("uid")
        if known is not None and uid != self._uids.get(key):
            # an Experiment of that name re-created: a fresh controller, never the old one's state
            known.stop()
            del self.controllers[key]
        if key not in self.controllers:
            self._uids[key] = uid
            self.controllers[key] = ExperimentController(
                namespace=namespace, name=name, store=self._store_factory(namespace, name, body),
                registry=self.registry, body=lambda: body, checkpoint_storage=self._checkpoint_storage,
                dashboard_url=self._dashboard_url,
                results=ResultsRecorder(self.results, namespace, lambda: body) if self.results is not None else None)
        return self.controllers[key]

    def wake(self, namespace: str, name: str) -> None:
        controller = self.controllers.get((namespace, name))
        if controller is not None:
            controller.wake()
        wakeup = self._rest_wakeups.get((namespace, name))
        if wakeup is not None:
            wakeup.set()

    def forget(self, namespace: str, name: str) -> None:
        self.controllers.pop((namespace, name), None)

    async def delete(self, namespace: str, name: str, body: Mapping[str, Any], *, give_up: bool = False) -> None:
        """The Experiment is being deleted: end its trials' runs (Trials go by GC).

        Raises ``CleanupPending`` while that does not hold (the platform unreachable, runs
        still alive): kopf retries and the finalizer stays. Works the same when no
        controller runs here (deleted while the operator was down): the spec names the
        platform (``PlatformRegistry.cleanup_platform``: None when nothing needs ending).
        ``give_up`` (the cleanup timeout has passed): a failed cleanup is abandoned
        instead, yet what this operator holds for the Experiment is let go all the same
        (the trials' own lease ends them: trainable/host.py); the error is re-raised."""
        cluster = self.registry.cleanup_platform(body.get("spec") or {}, namespace)
        address = cluster.address if cluster is not None else ""
        self._deleting[address] = self._deleting.get(address, 0) + 1    # its driver stays meanwhile
        try:
            await self._delete(namespace, name, body, cluster)
        except Exception:
            if give_up:
                await self._let_go(namespace, name, body)
            raise
        finally:
            self._deleting[address] -= 1
            if not self._deleting[address]:
                del self._deleting[address]

    async def _delete(self, namespace: str, name: str, body: Mapping[str, Any], cluster: Platform | None) -> None:
        key = (namespace, name)
        controller = self.controllers.get(key)
        if controller is not None:
            controller.stop()
        prefix = f"{namespace}/{name}/"
        if cluster is not None:
            if not await cluster.ensure_connected():
                if await self._store_factory(namespace, name, body).list_trials():
                    raise CleanupPending(f"cannot stop the trials of {prefix[:-1]}: {cluster.last_error}")
                # no Trial, so nothing was ever launched (a Trial is created before its
                # launch): an address never reached (a typo) holds the deletion up no longer
                cluster = None
        if cluster is not None:
            try:
                left = await cluster.end_all(prefix)
            except Exception as error:  # noqa: BLE001 - the platform could not tell: try again
                cluster.mark_unavailable(error)
                raise CleanupPending(f"cannot end the runs of {prefix[:-1]}: {error}") from error
            if left:
                raise CleanupPending(f"{left} runs of {prefix[:-1]} are still alive on {cluster.address}")
        await self._let_go(namespace, name, body)

    async def _let_go(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """Forget the deleted Experiment: its ledger holdings, its controller, its stored results."""
        key = (namespace, name)
        self.resting.pop(key, None)
        self.wake(namespace, name)     # a daemon at rest sees ``stopped`` at once
        controller = self.controllers.get(key)
        if controller is not None:
            await controller.release_resources()
        if self.controllers.get(key) is controller:   # not a re-created Experiment's meanwhile
            self.controllers.pop(key, None)
            self._uids.pop(key, None)
        uid = (body.get("metadata") or {}).get("uid")
        if self.results is not None and uid:
            self.results.forget_experiment(uid)

    def connections_in_use(self) -> set[str]:
        """The platform addresses some Experiment needs a connection to now."""
        in_use = {address for address in self._deleting if address}
        for controller in self.controllers.values():
            address = controller.needs_connection()
            if address is not None:
                in_use.add(address)
        return in_use

    async def retire_idle_drivers(self) -> list[str]:
        """End the driver processes no Experiment has needed for the registry's grace period."""
        return await self.registry.retire_idle(self.connections_in_use())

    async def retire_idle_drivers_forever(self, interval_s: float) -> None:
        """``retire_idle_drivers`` every ``interval_s`` until cancelled (the operator's life)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.retire_idle_drivers()
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("ending idle driver processes failed; retrying")
