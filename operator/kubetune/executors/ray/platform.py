"""The Ray platform: one ``RayPlatform`` per Ray cluster, shared by every Experiment
that runs on it: the executor (connection), the resource ledger, and the aggregated
autoscaler request.  ``RayPlatforms`` is its ``PlatformProvider`` (one per address).

Each Ray address an Experiment names gets a connection of its own, and an address
that cannot be reached (a typo, ``auto`` with no Ray nearby) fails only the
Experiments that name it: their condition RayUnavailable names the address and the
cause, and they are retried with backoff like any outage.  The address the operator
was started with is served by this process's own Ray driver; Ray allows one driver
per process, so every other address is served by a driver process of its own
(executors/ray/process.py says why a process and not Ray Client contexts).
``local`` runs trials (user code) on the operator's machine: inside a cluster, next
to its ServiceAccount token, so it is refused there unless the operator allows it.

A driver process lives while an Experiment needs its address and ``idle_s`` more (retire_idle).

Which other addresses an Experiment may name is the operator's choice (issue 25, N2):
its allow-list (spec/ray_allowlist.py, ``--ray-allowed-addresses``) is asked before any
connection, and an address it does not hold fails the Experiment (``RayAddressRefused``).
Another cluster may be a tenant's own, so its driver process is treated as the tenant's
(process.py: no credentials, JSON answers checked), its calls run on threads of its own
(a cluster that never answers holds those, not the operator's shared pool), and at most
``max_drivers`` run at once: past that an Experiment waits (its RayUnavailable says so)."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from kubetune.core.backoff import Backoff
from kubetune.core.resources import ResourceLedger, Resources
from kubetune.executors.platform import ExecutorPlatform, PlatformRefused
from kubetune.executors.ray.connection import RayConnection
from kubetune.executors.ray.errors import RayUnavailableError
from kubetune.executors.ray.growth import GrowthReader
from kubetune.executors.ray import sandbox
from kubetune.executors.ray.outage import STUCK_CALL_CHECK_S, outage_bounded
from kubetune.spec import ray_allowlist
from kubetune.spec.model import ExperimentSpec

log = logging.getLogger(__name__)
CAPACITY_REFRESH_SECONDS = 2.0
MAX_RECONNECT_BACKOFF_SECONDS = 30.0
DRIVER_IDLE_SECONDS = 300.0
DRIVER_THREADS = 4      # calls in flight to one other cluster's driver process
# calls in flight to the operator's own cluster: threads of its own, so calls stuck in an
# outage (outage.py) never take the threads the Kubernetes writes share (asyncio's default pool)
CLUSTER_THREADS = 8
WARM_PASSES = 3    # a trial's room passes to its Experiment's next, on the pooled worker: pool.py


class RayPlatform(ExecutorPlatform):
    """One Ray cluster, shared by every Experiment that runs on it (``Platform``)."""

    lost_run_message = "trial's Ray actor is gone (worker or node died)"
    idle_connection_ends = True     # a driver process nobody needs is ended (retire)

    def __init__(self, address: str, executor_factory: Callable[[str], RayConnection],
                 clock: Callable[[], float] = time.time, weights: Mapping[str, float] | None = None, *,
                 admit: Callable[[], str] | None = None, threads: int = 0) -> None:
        self.address = address
        self._admit = admit     # "" or why a new connection must wait (the driver-process cap)
        # threads of its own (0: the event loop's default pool), made when first needed
        self._thread_count = threads
        self._threads: ThreadPoolExecutor | None = None
        self.ledger = ResourceLedger(warm_passes=WARM_PASSES)
        self.ledger.set_weights(dict(weights or {}))    # namespace -> weight (core/fair_share.py)
        self._executor_factory = executor_factory
        self._clock = clock
        self.executor: RayConnection | None = None
        self._lock = asyncio.Lock()
        self._capacity_at = float("-inf")
        self._growth = GrowthReader(clock)     # the autoscaler's node types (growth.py)
        self._reconnect = Backoff(first_s=1.0, max_s=MAX_RECONNECT_BACKOFF_SECONDS)
        self.last_error = ""
        self._requested: list[dict[str, float]] | None = None   # last request sent; None: none yet
        self.uses = 0     # ensure_connected calls: a use since a count was taken keeps the connection
        self.retired = False   # its connection ended for want of use (retire); until the next use
        self._changing = False   # a connect or a retire under way: not connected, every use waits
        self.stuck_check_s = STUCK_CALL_CHECK_S

    @property
    def connected(self) -> bool:
        return self.executor is not None and not self.last_error and not self._changing

    async def ensure_connected(self) -> bool:
        """Connect if needed; False (with ``last_error`` set) while Ray is unreachable.
        Retries back off exponentially up to 30 s, so an outage is not a crash loop.
        Connected, it waits for no lock: not behind a capacity refresh (Ray calls, every
        2 s), which held up every cycle of a burst."""
        if self.connected:
            self.uses += 1      # a retire not yet past its count of uses sees this one
            return True
        async with self._lock:
            self.uses += 1
            self.retired = False
            if self.executor is not None and not self.last_error:
                return True
            now = self._clock()
            if not self._reconnect.due(now):
                return False
            if self.executor is None and self._admit is not None:
                waiting = self._admit()     # asked and taken with no await in between: atomic
                if waiting:
                    self.last_error = waiting
                    return False
            self._changing = True
            try:
                if self.executor is None:
                    # in a thread: the first one imports Ray (seconds under load), which
                    # on the event loop held up every Experiment's work meanwhile
                    self.executor = await asyncio.to_thread(self._executor_factory, self.address)
                await self.in_thread(self.executor.connect)
                self._requested = None     # a cluster that came back knows no request of ours
                await self._refresh_capacity_locked(force=True)
            except asyncio.CancelledError:     # its daemon stopped: no executor left passing for connected
                self.last_error = f"connecting to Ray at {self.address} was cancelled"
                raise
            except Exception as error:  # noqa: BLE001 - any failure to reach Ray means "unavailable"
                self.last_error = f"cannot reach Ray at {self.address}: {_cause(error)}"
                log.warning("%s (next attempt in %.0fs)", self.last_error, self._reconnect.failed(now))
                return False
            finally:
                self._changing = False
            self.last_error = ""
            self._reconnect.reset()
            return True

    async def in_thread(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a (blocking) executor call in a thread; given up with RayUnavailableError if
        the cluster goes away while it waits (outage.py)."""
        if not self._thread_count:
            future = asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))
        else:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self._thread_count, thread_name_prefix=f"ray {self.address}")
            future = asyncio.get_running_loop().run_in_executor(self._threads, functools.partial(call, *args, **kwargs))
        return await outage_bounded(future, self._gcs_endpoint, lambda why: RayUnavailableError(self.address, why),
                                    self.stuck_check_s, on_give_up=self._new_threads)

    def _new_threads(self) -> None:
        """A call was given up on a blocked thread: later calls get threads of a new pool
        rather than queue behind it (the old pool's threads end as their calls return)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None

    def _gcs_endpoint(self) -> tuple[str, int] | None:
        executor = self.executor
        return executor.gcs_endpoint() if executor is not None else None

    def mark_unavailable(self, error: BaseException | str) -> None:
        """A call failed because the cluster went away: reconnect before the next call."""
        self.last_error = f"lost Ray at {self.address}: {_cause(error)}"
        self._reconnect.hold(self._clock())

    async def retire(self, uses: int) -> bool:
        """End the connection (a driver process: the process) and forget what it knew;
        the next ``ensure_connected`` makes a new one.  Its autoscaler request is
        withdrawn first (nothing waits: no Experiment uses it).  False, and nothing
        ended, if there was none, it was used since ``uses`` was counted, or its
        request could not be withdrawn yet."""
        async with self._lock:
            executor = self.executor
            if executor is None or self.uses != uses:
                return False
            self._changing = True
            try:
                return await self._retire(executor)
            finally:
                self._changing = False   # a connect or a retire under way: not connected, every use waits

    async def _retire(self, executor: RayConnection) -> bool:
        if self._requested:
            # a request stands until replaced (nothing times it out): withdraw it first,
            # reconnecting if the cluster was lost; until that works the driver stays
            # and the next check tries again
            if self.last_error and not self._reconnect.due(self._clock()):
                return False
            try:
                if self.last_error:
                    await self.in_thread(executor.connect)
                await self.in_thread(executor.request_resources, [])
            except Exception as error:  # noqa: BLE001 - Ray unreachable: retried next check
                log.warning("cannot withdraw the autoscaler request on %s: %s", self.address, error)
                return False
        self.executor = None
        self.last_error = ""
        self._reconnect.reset()
        self._requested, self._capacity_at = None, float("-inf")
        self._growth.forget()
        self.retired = True
        await self.in_thread(executor.close)
        if self._threads is not None:     # its threads go with it, until the next use
            self._threads.shutdown(wait=False)
            self._threads = None
        return True

    async def end_runs(self, prefix: str) -> bool:
        if not await self.ensure_connected():
            return False
        stopped = await self.in_thread(self.executor.stop_all, prefix)
        if stopped:
            log.info("%s: stopped %d actors of the finished experiment", prefix.rstrip("/"), stopped)
        # the trials it left queued are out of the ledger: withdraw their autoscaler demand
        # now, since a finished Experiment's cycles make no Ray call (idle_connection_ends) and
        # the request stands until replaced (extra GPU nodes would stay up); retried next
        # cycle if it failed
        return await self.sync_autoscaler_request()

    async def end_all(self, prefix: str) -> int:
        # every actor and placement group under the experiment, pooled workers included
        await self.in_thread(self.executor.stop_all, prefix)
        return await self.in_thread(self.executor.remaining, prefix)

    async def release(self, trial_keys: list[str]) -> None:
        for key in trial_keys:
            self.ledger.release(key)
        # its queued demand goes with it, even if no other Experiment runs a cycle
        await self.sync_autoscaler_request()

    async def refresh_capacity(self) -> None:
        if self._clock() - self._capacity_at < CAPACITY_REFRESH_SECONDS or self._lock.locked():
            return      # fresh, or one refresh in flight (Ray calls): 200 cycles waited for each (issue 26)
        async with self._lock:
            await self._refresh_capacity_locked(force=False)

    async def _refresh_capacity_locked(self, *, force: bool) -> None:
        now = self._clock()
        if not force and now - self._capacity_at < CAPACITY_REFRESH_SECONDS:
            return
        capacity = await self.in_thread(self.executor.cluster_resources)
        # read beside placement, not before it (growth.py: a busy head takes a minute)
        executor = self.executor
        growth_known, node_types = await self._growth.current(lambda: self.in_thread(executor.node_types),
                                                              wait_s=None if force else 0)
        self.ledger.set_capacity(Resources.from_ray(capacity.total),
                                 [Resources.from_ray(node.total) for node in capacity.nodes] or None,
                                 node_types, growth_known=growth_known, growth_unknown_because=self._growth.error)
        self._capacity_at = now
        await self._sync_autoscaler_request()

    async def sync_autoscaler_request(self) -> bool:
        """Update the autoscaler request now (demand left with a deleted or finished
        Experiment).  False if it could not be sent (not connected, or the call failed)."""
        async with self._lock:
            if not self.connected:
                return False
            try:
                await self._sync_autoscaler_request()
            except Exception as error:  # noqa: BLE001 - the caller or the next capacity refresh retries
                log.warning("cannot update the autoscaler request on %s: %s", self.address, error)
                return False
            return True

    async def _sync_autoscaler_request(self) -> None:
        """Tell the autoscaler about queued demand over all Experiments on this cluster
        (each request replaces the previous one); withdraw it when nothing waits."""
        if not self.ledger.growth_known or not (self.ledger.autoscaling or self._requested):
            # node types not read yet (growth.py): a request now could ask for what no node type
            # offers (Infeasible moments later). A cluster that cannot grow is asked nothing
            return
        grow = self.ledger.autoscaling and self.ledger.waiting_bundles()
        # request_resources sizes the cluster for the whole list, so it names what is held
        # as well as what waits (and changes when either does); an empty list withdraws it
        bundles = [bundle.to_ray() for bundle in self.ledger.autoscaler_request()] if grow else []
        if bundles == self._requested:
            return
        await self.in_thread(self.executor.request_resources, bundles)
        self._requested = bundles


def _cause(error: BaseException | str) -> object:
    # the executor's RayUnavailableError names the address again: keep only its cause
    return getattr(error, "cause", None) or error


class RayAddressRefused(PlatformRefused):
    """A Ray address this operator does not connect to: the message says what to change."""

    def __init__(self, cause: str):
        super().__init__("RayAddressRefused", cause)


class RayPlatforms:
    """Operator-wide: the one RayPlatform per Ray address (the ``PlatformProvider`` of
    ``spec.executor: ray``).

    ``executor_factory`` makes the executor of ``default_address`` (this process's Ray
    driver); ``separate_factory(address, token_env)`` that of any other address (a
    driver process of its own; ``token_env``: the environment variable holding that
    cluster's token, from its allow-list entry).  Without it (``kubetune run``: one
    Experiment, one address) other addresses are refused.  ``allowed``: the other
    addresses an Experiment may name (None: any, as in ``kubetune run``); ``max_drivers``:
    driver processes at once (0: no limit)."""

    def __init__(self, default_address: str, executor_factory: Callable[[str], RayConnection], *,
                 allow_local: bool = True, separate_factory: Callable[[str, str], RayConnection] | None = None,
                 idle_s: float = DRIVER_IDLE_SECONDS, clock: Callable[[], float] = time.monotonic,
                 weights: Mapping[str, float] | None = None,
                 allowed: tuple[ray_allowlist.Entry, ...] | None = None, max_drivers: int = 0,
                 sandbox_abi: int = sandbox.FULL_ABI, allow_unsandboxed: bool = False) -> None:
        self.default_address = default_address
        # the node's Landlock ABI (0: none), which sandboxes the driver processes (sandbox.py)
        self.sandbox_abi = sandbox_abi
        self.allow_unsandboxed = allow_unsandboxed
        self.weights = dict(weights or {})
        self.idle_s = idle_s
        self.allowed = allowed
        self.max_drivers = max_drivers
        self._clock = clock
        # separate addresses no Experiment needs: since when, and the handle's use count then
        self._idle_since: dict[str, tuple[float, int]] = {}
        self.allow_local = allow_local
        self._executor_factory = executor_factory
        self._separate_factory = separate_factory
        self._handles: dict[str, RayPlatform] = {}

    def resolve(self, requested: str | None) -> str:
        return requested or self.default_address

    def platform_for(self, spec: ExperimentSpec, namespace: str) -> RayPlatform:
        return self.get(self.resolve(spec.ray.address), namespace)

    def cleanup_platform(self, spec: Mapping[str, Any], namespace: str) -> RayPlatform | None:
        """The Ray cluster a deleted Experiment's trials ran on; None for an address this
        operator refuses (nothing ran there, and nothing connects there now)."""
        try:
            return self.get(self.resolve((spec.get("ray") or {}).get("address")), namespace)
        except PlatformRefused:
            return None

    async def policy_violations(self, namespace: str, spec: ExperimentSpec) -> list[str]:
        return []

    def platforms(self) -> list[RayPlatform]:
        return list(self._handles.values())

    def get(self, address: str, namespace: str | None = None) -> RayPlatform:
        """The platform of ``address``; for an Experiment of ``namespace``, only an address
        the allow-list lets it name (else ``RayAddressRefused``, before any connection)."""
        entry = None
        if address != self.default_address and self.allowed is not None:
            entry = ray_allowlist.match(address, namespace or "", self.allowed)
            if entry is None:
                raise RayAddressRefused(ray_allowlist.refusal(address, self.default_address, self.allowed))
        if address == "local" and not self.allow_local:
            raise RayAddressRefused(
                "Ray address 'local' would run trials inside the operator's pod, next to its "
                "ServiceAccount token; start the operator with --allow-local-ray to allow it")
        if address not in self._handles:
            if address == self.default_address:
                self._handles[address] = RayPlatform(address, self._executor_factory, weights=self.weights,
                                                     threads=CLUSTER_THREADS)
            elif self._separate_factory is not None:
                separate, token_env = self._separate_factory, entry.token_env if entry is not None else ""
                self._handles[address] = RayPlatform(address, lambda a: separate(a, token_env), weights=self.weights,
                                                     admit=self._admit_driver, threads=DRIVER_THREADS)
            else:
                raise RayAddressRefused(
                    f"this run serves Ray at {self.default_address!r} only; spec.ray.address {address!r} "
                    "needs `kubetune operator`, which connects to each address an Experiment names")
        return self._handles[address]

    def _admit_driver(self) -> str:
        """"" if one more driver process may start, else why the Experiment waits."""
        refused = sandbox.refusal(self.sandbox_abi, self.allow_unsandboxed)
        if refused:
            return refused
        running = sum(1 for address, handle in self._handles.items()
                      if address != self.default_address and handle.executor is not None)
        if self.max_drivers and running >= self.max_drivers:
            return (f"waiting for a Ray driver process: this operator runs at most {self.max_drivers} at once "
                    "(operator flag --max-ray-drivers, Helm value ray.maxDriverProcesses), all serving other "
                    "Ray addresses; one ends once no Experiment has used its address for a while")
        return ""

    async def retire_idle(self, in_use: set[str]) -> list[str]:
        """End the driver processes of the addresses (other than the operator's own) that
        no Experiment has needed for ``idle_s``: ``in_use`` is what they need now.  Safe
        to call at any time and as often as wanted; returns the addresses it ended."""
        now = self._clock()
        retired = []
        for address, handle in list(self._handles.items()):
            if address == self.default_address or address in in_use or handle.executor is None:
                self._idle_since.pop(address, None)
                continue
            since, uses = self._idle_since.get(address, (now, handle.uses))
            if uses != handle.uses:      # used meanwhile (a deletion's cleanup): idle from now
                since, uses = now, handle.uses
            self._idle_since[address] = (since, uses)
            if now - since >= self.idle_s and await handle.retire(uses):
                self._idle_since.pop(address, None)
                log.info("stopped the Ray driver process for %s: no Experiment has used it for %.0fs",
                         address, now - since)
                retired.append(address)
        return retired
