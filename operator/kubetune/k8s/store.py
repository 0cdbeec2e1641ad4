"""KubeStore: the controller's Store on a real API server (Trial and Experiment
resources, Events).  The blocking client runs in threads; every write is one call.

Every write goes through ``core.sanitize`` (valid JSON, bounded: NaN and Infinity as
their documented strings) and is counted in bytes (``bytes_written`` and the
``kubetune_api_write_bytes_total`` metric).  A refused write raises ``WriteRefused``
with the API's reason; the controller retries it with backoff and surfaces it
(controller/write_failures.py)."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping

from kubernetes.client.exceptions import ApiException

from kubetune import metrics
from kubetune.k8s.errors import StaleTrial, WriteRefused
from kubetune.core.sanitize import MAX_MESSAGE_BYTES, cap_text, json_safe, json_size
from kubetune.k8s import rate_limit, trial_lists
from kubetune.k8s.events import EventPoster, Involved
from kubetune.k8s.request_gate import PROGRESS, RECORD, RequestGate
from kubetune.k8s.client import EXPERIMENT_LABEL, EXPERIMENTS, GROUP, TRIALS, VERSION, custom_objects

log = logging.getLogger(__name__)

# A write waits this long for the API server; a hung connection is a refused write,
# retried later, not a reconcile loop stuck for the client's default (forever).
WRITE_TIMEOUT_S = 30
LIST_PAGE = 500          # Trials per page of a LIST
LIST_TIMEOUT_S = 60      # one page (of full Trials, with their status)
# the merge patch (of the main resource) that clears an object's managedFields: an
# empty list would be ignored, a list of one empty entry clears them (the API's documented way)
STRIP_MANAGED_FIELDS: Mapping[str, Any] = {"metadata": {"managedFields": [{}]}}


# API requests have threads of their own: in the event loop's default pool (6 threads on
# 2 cores) they queued behind the Ray polls of every running Experiment (each holds a
# thread for its short long-poll), so 40 Experiments made a new one's first Trial and
# every status write wait seconds for a thread, not for the API server (issue 26).  The
# rate limit, not the thread count, bounds what reaches the API server; which waiting
# request goes next is the gate's (k8s/request_gate.py), not the pool's queue.
API_THREADS = 16
_threads: ThreadPoolExecutor | None = None
_threads_lock = threading.Lock()
# one gate per event loop (a process may run several, one after another: tests, benchmarks)
_gates: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RequestGate]" = weakref.WeakKeyDictionary()
_posters: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, EventPoster]" = weakref.WeakKeyDictionary()


def _api_threads() -> ThreadPoolExecutor:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api")
        return _threads


def _events() -> EventPoster:
    """This event loop's Event poster, on the shared API client, through the gate."""
    loop = asyncio.get_running_loop()
    poster = _posters.get(loop)
    if poster is None:
        poster = _posters[loop] = EventPoster(_limited, custom_objects(connections=API_THREADS))
    return poster


def _gate() -> RequestGate:
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = RequestGate(API_THREADS)
    return gate


async def _admit(priority: int) -> None:
    """Wait for the operator's rate limit (k8s/rate_limit.py), then for a thread; the
    request admitted must go through ``_admitted``, which gives its place back."""
    await rate_limit.acquire()
    await _gate().enter(priority)


async def _admitted(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """An admitted request, in a thread."""
    try:
        run = functools.partial(contextvars.copy_context().run, call, *args, **kwargs)   # as asyncio.to_thread
        return await asyncio.get_running_loop().run_in_executor(_api_threads(), run)
    finally:
        _gate().leave()


async def _limited(call: Callable[..., Any], *args: Any, priority: int = RECORD, **kwargs: Any) -> Any:
    """One API request, in a thread, once the operator's rate limit allows and before the
    waiting requests of a larger ``priority`` number (k8s/request_gate.py)."""
    await _admit(priority)
    return await _admitted(call, *args, **kwargs)


def refused(error: BaseException) -> WriteRefused:
    """The API's status, reason and message of a failed call, whatever raised it."""
    if isinstance(error, ApiException):
        reason, message = error.reason or "", ""
        try:
            answer = json.loads(error.body or "{}")
            reason, message = answer.get("reason") or reason, answer.get("message") or ""
        except (ValueError, AttributeError):
            message = str(error.body or "")
        return WriteRefused(int(error.status or 0), reason or "Unknown", cap_text(message or str(error), 700))
    return WriteRefused(0, "Unavailable", cap_text(f"{type(error).__name__}: {error}", 700))


def owned_by(body: Mapping[str, Any], uid: str | None) -> bool:
    """Whether ``body`` belongs to the Experiment with ``uid`` (None: any owner)."""
    if uid is None:
        return True
    return any(ref.get("uid") == uid for ref in (body.get("metadata") or {}).get("ownerReferences") or ())


class KubeStore:
    def __init__(self, namespace: str, experiment: str, *, uid: str | None = None) -> None:
        self.namespace = namespace
        self.experiment = experiment
        # Trials are matched by their owner's UID, not only by label: after a delete and a
        # re-create of the same name (kubectl replace --force, an Argo CD Replace) the old
        # Experiment's Trials linger until the garbage collector removes them
        self.uid = uid
        self._api = custom_objects(connections=API_THREADS)
        self.writes = 0
        self.bytes_written = 0
        self._waiting_for: set[str] = set()   # Trial names told to wait for an earlier Experiment's

    async def list_trials(self) -> list[dict[str, Any]]:
        return [item for item in await self.list_trials_of(self.experiment) if owned_by(item, self.uid)]

    async def list_trials_of(self, experiment: str) -> list[dict[str, Any]]:
        """One LIST shared with the other Experiments of the namespace asking meanwhile
        (k8s/trial_lists.py)."""
        return await trial_lists.trials_of(self.namespace, experiment, EXPERIMENT_LABEL,
                                           lambda: _admit(PROGRESS), self._list_pages)

    async def _list_pages(self, experiments: list[str]) -> list[dict[str, Any]]:
        """The Trials of ``experiments`` in pages of ``LIST_PAGE`` (``limit`` and ``continue``):
        a 10,000-Trial Experiment is not one response the API server builds in memory and
        sends at once.  The first page is admitted already (trial_lists.py)."""
        items: list[dict[str, Any]] = []
        page = ""
        while True:
            options: dict[str, Any] = {"label_selector": trial_lists.label_selector(EXPERIMENT_LABEL, experiments),
                                       "limit": LIST_PAGE, "_request_timeout": LIST_TIMEOUT_S}
            if page:
                options["_continue"] = page
            listing = await (functools.partial(_limited, priority=PROGRESS) if page else _admitted)(
                self._api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, TRIALS, **options)
            items += listing["items"]
            page = (listing.get("metadata") or {}).get("continue") or ""
            if not page:
                return items

    def _count(self, resource: str, verb: str, body: Any) -> None:
        size = json_size(body)
        self.writes += 1
        self.bytes_written += size
        metrics.api_write(resource, verb, size)

    async def _call(self, call: Callable[..., Any], *args: Any, priority: int = RECORD, **kwargs: Any) -> Any:
        try:
            return await _limited(call, *args, priority=priority, _request_timeout=WRITE_TIMEOUT_S, **kwargs)
        except ApiException:
            raise
        except Exception as error:   # urllib3: refused, reset, timed out
            raise refused(error) from error

    async def create_trial(self, body: dict[str, Any]) -> dict[str, Any]:
        """One attempt, no waiting here: a Trial of that name left by an earlier Experiment
        of the same name is deleted and ``StaleTrial`` raised, and the controller's effect
        queue retries the create (with its backoff) while the Experiment's other work goes on."""
        body = json_safe(body)
        name = body["metadata"]["name"]
        self._count("trials", "create", body)
        try:
            return await self._call(self._api.create_namespaced_custom_object, GROUP, VERSION,
                                    self.namespace, TRIALS, body, priority=PROGRESS)
        except ApiException as error:
            if error.status != 409:
                raise refused(error) from error
        existing = await self._get_trial(name)
        if existing is None:
            raise StaleTrial(f"Trial {self.namespace}/{name} went away while being created; created again next")
        if owned_by(existing, self.uid):
            # created by an earlier attempt (retry or restart): the deterministic name makes it ours
            self._waiting_for.discard(name)
            return existing
        if name not in self._waiting_for:
            self._waiting_for.add(name)
            await self.event("Normal", "WaitingForEarlierTrial",
                             f"{name}: a Trial of that name left by an earlier Experiment {self.experiment} "
                             "is being deleted; the new one is created after it")
        await self._delete_stale(existing)
        raise StaleTrial(f"Trial {self.namespace}/{name} of an earlier Experiment {self.experiment} "
                         "is still being deleted")

    async def _get_trial(self, name: str) -> dict[str, Any] | None:
        try:
            return await _limited(
                self._api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, TRIALS, name, priority=PROGRESS)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def _delete_stale(self, trial: Mapping[str, Any]) -> None:
        """Delete a Trial whose owner is an earlier Experiment (the garbage collector would,
        later); the UID precondition leaves a Trial re-created meanwhile alone."""
        meta = trial["metadata"]
        log.info("%s/%s: deleting Trial %s of an earlier Experiment of that name",
                 self.namespace, self.experiment, meta["name"])
        metrics.api_write("trials", "delete")
        try:
            await _limited(
                self._api.delete_namespaced_custom_object, GROUP, VERSION, self.namespace, TRIALS, meta["name"],
                body={"preconditions": {"uid": meta["uid"]}, "propagationPolicy": "Background"})
        except ApiException as error:
            if error.status not in (404, 409):
                raise

    async def patch_trial_status(self, name: str, status: Mapping[str, Any]) -> None:
        body = {"status": json_safe(dict(status))}
        self._count("trials", "patch_status", body)
        try:
            await self._call(self._api.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace,
                             TRIALS, name, body)
        except ApiException as error:
            if error.status != 404:   # deleted under us (Experiment deletion): nothing to record
                raise refused(error) from error

    async def patch_experiment_status(self, status: Mapping[str, Any]) -> None:
        # No UID precondition here: the API server ignores metadata in a status patch
        # (measured on v1.34: a wrong metadata.uid is accepted).  A controller of an older
        # Experiment of this name is replaced by the handlers as soon as the UID changes.
        body = {"status": json_safe(dict(status))}
        self._count("experiments", "patch_status", body)
        try:
            await self._call(self._api.patch_namespaced_custom_object_status, GROUP, VERSION, self.namespace,
                             EXPERIMENTS, self.experiment, body)
        except ApiException as error:
            # 404: deleted.  Anything else (a 422 is a status the schema refuses) is surfaced.
            if error.status != 404:
                raise refused(error) from error

    async def strip_managed_fields(self, trial: str) -> None:
        """A finished Trial's ``metadata.managedFields`` stripped (controller/managed_fields.py):
        a merge PATCH of the main resource, as the status subresource ignores metadata.
        Once stripped, a strip again changes nothing (no new resourceVersion)."""
        body = STRIP_MANAGED_FIELDS
        self._count("trials", "patch", body)
        try:
            await self._call(self._api.patch_namespaced_custom_object, GROUP, VERSION, self.namespace,
                             TRIALS, trial, body)
        except ApiException as error:
            if error.status != 404:   # deleted under us: nothing to strip
                raise refused(error) from error

    async def event(self, kind: str, reason: str, message: str) -> None:
        """An Event on the Experiment, queued (k8s/events.py): never waits, never raises."""
        _events().post(Involved("Experiment", self.namespace, self.experiment, self.uid), kind, reason, message)

    async def trial_event(self, trial: str, kind: str, reason: str, message: str) -> None:
        """An Event on one Trial (``kubectl describe trial``), queued as the Experiment's are."""
        _events().post(Involved("Trial", self.namespace, trial, owner=self.uid), kind, reason, message)
