"""Finding the actors of an experiment again after the operator restarted (see
executors/ray/executor.py).

Which actor hosts which trial is asked of the actors themselves (``describe``), so
nothing needs recording on the Trial: the executor lists the named actors of an
experiment once and re-attaches by trial key.  An actor that has not answered yet
stays "probing"; until it answers, a trial of its experiment may be the one it hosts.

An answer comes from a process that runs the user's code (answers.py), so what an
actor claims is checked against what the operator itself assigned: only actors in the
experiment's own Ray namespace, under a name the operator gives (its trial key for a
dedicated actor, a worker name of that experiment for a pooled one), and only a trial
of that experiment.  An actor claiming another trial is killed, never adopted.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from kubetune.executors.base import TrialState, TrialUpdate
from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError, Call, call, read, ready
from kubetune.spec.model import TrialResources
from kubetune.executors.ray.pool import (ACTOR_PREFIX, WORKER_MARK, Worker, WorkerPool, actor_name,
                                         experiment_namespace, experiment_prefix)
from kubetune.executors.ray.named_actors import NamedActors
from kubetune.executors.ray.slots import Slot

log = logging.getLogger(__name__)


def actor_group(name: str) -> str | None:
    """The experiment prefix ``"<ns>/<experiment>/"`` of one of our actors' names (None: not ours)."""
    parts = name[len(ACTOR_PREFIX):].split("/") if name.startswith(ACTOR_PREFIX) else []
    return f"{parts[0]}/{parts[1]}/" if len(parts) >= 3 else None


def list_named_actors() -> list[dict[str, Any]]:
    """Every named actor of the cluster (one GCS call): read through ``NamedActors``."""
    return ray.util.list_named_actors(all_namespaces=True)


def could_host(name: str, key: str) -> bool:
    """Whether actor ``name`` (with ``kubetune/``) may host trial ``key``: a pooled worker of
    its experiment hosts any trial of it, a dedicated actor only the one it is named for."""
    return name.startswith(ACTOR_PREFIX + experiment_prefix(key) + WORKER_MARK) or name == actor_name(key)


def is_experiment_prefix(prefix: str) -> bool:
    return prefix.endswith("/") and prefix.count("/") == 2


@dataclass
class _Discovery:
    at: float = 0.0
    probing: dict[str, tuple[Any, Call]] = field(default_factory=dict)   # name -> (handle, describe call)
    asked_at: dict[str, float] = field(default_factory=dict)   # name -> when first asked (monotonic)
    ended: dict[str, str] = field(default_factory=dict)   # name -> why kubetune ended it unanswered


class ActorDiscovery:
    """Adopts the actors of ``namespace`` into ``slots`` (trials) and ``pool`` (idle workers).

    ``lock`` guards ``slots`` and is the pool's too."""

    def __init__(self, lock: threading.RLock, slots: dict[str, Slot], pool: WorkerPool, *,
                 namespace: str, rpc_timeout_s: float, named: NamedActors | None = None):
        self._lock = lock
        self._slots = slots
        self._pool = pool
        # the cluster's named actors: one listing shared by every Experiment (the executor's)
        self._named = named if named is not None else NamedActors(list_named_actors, actor_group)
        self.namespace = namespace
        self.rpc_timeout_s = rpc_timeout_s
        self._discovered: dict[str, _Discovery] = {}

    @property
    def first_wait_s(self) -> float:
        return min(2.0, self.rpc_timeout_s)

    def actor_names(self, prefix: str, *, fresh: bool = False) -> list[str]:
        """Names of our live actors under a trial-key prefix, without ``kubetune/``: each
        in the Ray namespace of its own experiment (an actor placed elsewhere is not ours).

        From the listing shared for a moment (named_actors.py), or ``fresh``: asked of
        Ray now, for a caller that must not miss an actor created just before."""
        group = prefix if is_experiment_prefix(prefix) else None
        return [name[len(ACTOR_PREFIX):] for namespace, name in self._named.actors(group, fresh=fresh)
                if name.startswith(ACTOR_PREFIX + prefix) and name.count("/") >= 3
                and namespace == experiment_namespace(self.namespace, name[len(ACTOR_PREFIX):])]

    def experiments(self, prefix: str) -> list[str]:
        """The experiment prefixes (``"<ns>/<experiment>/"``) with named actors that are
        under ``prefix`` or hold it."""
        return [group for group in self._named.groups() if group.startswith(prefix) or prefix.startswith(group)]

    def discover_once(self, prefix: str) -> None:
        with self._lock:
            known = prefix in self._discovered
        if not known:
            self.discover(prefix, wait_s=self.first_wait_s)

    def silent(self, key: str) -> dict[str, float]:
        """The actors that may host trial ``key`` and have not said yet what they host,
        with how long ago they were first asked (seconds)."""
        now = time.monotonic()
        with self._lock:
            seen = self._discovered.get(experiment_prefix(key))
            return {} if seen is None else {name: now - seen.asked_at.get(name, now)
                                            for name in self._unanswered(seen, key)}

    def _unanswered(self, seen: _Discovery, key: str) -> list[str]:
        """The actors asked under ``seen`` that may host ``key``, have not answered, and are
        not this executor's own: a worker it made was probed by a poll's discovery before its
        slot was recorded (it is known now, and hosts what its slot says), and while it is
        starting it must not hold back the Experiment's other launches, nor be killed as
        silent by one of them.  Callers hold the lock."""
        candidates = [name for name in seen.probing if could_host(name, key)]
        if not candidates:      # the common case: no set of every slot's worker built
            return []
        own = {slot.worker.name for slot in self._slots.values()}
        return [name for name in candidates if name not in own]

    def end_silent(self, prefix: str, names: list[str], why: str) -> None:
        """Kill actors that never answered, and their placement groups (detached: they
        outlive the actor): whatever they host must not run beside a new run.  ``why``
        becomes the error of a trial found hosted by none of them later."""
        with self._lock:
            seen = self._discovered.get(prefix)
            ended = [] if seen is None else [(name, seen.probing.pop(name)) for name in names if name in seen.probing]
            for name, _ in ended:
                seen.asked_at.pop(name, None)
                seen.ended[name] = why
        for name, (handle, pending) in ended:    # Ray calls, outside the lock
            self._pool.kill(Worker(name, handle, TrialResources(), namespace=pending.namespace))
            self._pool.remove_placement_groups(name)

    def find_unknown(self, keys: list[str]) -> None:
        """Look for actors hosting trials we do not know (after a restart)."""
        prefixes = {experiment_prefix(key) for key in keys}
        for prefix in prefixes:
            with self._lock:
                seen = self._discovered.get(prefix)
            if seen is None:
                self.discover(prefix, wait_s=self.first_wait_s)
            elif seen.probing or time.monotonic() - seen.at > 1.0:
                self.discover(prefix, wait_s=0.0)

    def discover(self, prefix: str, wait_s: float) -> None:
        """Ask every named actor under ``prefix`` what it hosts; adopt what we did not know."""
        names = [ACTOR_PREFIX + name for name in self.actor_names(prefix)]
        namespace = experiment_namespace(self.namespace, prefix)
        with self._lock:
            seen = self._discovered.setdefault(prefix, _Discovery())
            seen.at = time.monotonic()
            known = {s.worker.name for s in self._slots.values()}
            known |= {w.name for w in self._pool.idle_workers()}
            new = [name for name in names if name not in known and name not in seen.probing]
        asked = {}
        for name in new:    # Ray calls, outside the lock (pool.py says why)
            try:
                handle = ray.get_actor(name, namespace=namespace)
            except ValueError:
                continue  # died meanwhile
            asked[name] = (handle, call(handle.describe, namespace))
        with self._lock:
            for name, probe in asked.items():
                seen.probing.setdefault(name, probe)    # another thread may have asked it meanwhile
                seen.asked_at.setdefault(name, seen.at)
            probing = dict(seen.probing)
        if not probing:
            return
        done = ready([c for _, c in probing.values()], wait_s)
        for name, (handle, pending) in probing.items():
            if pending.ref not in done:
                continue
            with self._lock:
                seen.probing.pop(name, None)
                seen.asked_at.pop(name, None)
            try:
                answer = checked.description(read(pending))
                worker = self._worker(name, handle, prefix, answer)
            except AnswerError as exc:
                if exc.kind == "rejected":
                    log.warning("actor %s: %s; ending it", name, exc)
                    self._pool.kill(Worker(name, handle, TrialResources(), namespace=pending.namespace))
                continue
            self._adopt(name, worker, answer)

    def _worker(self, name: str, handle: Any, prefix: str, answer: dict) -> Worker:
        """The worker an answer describes, if it claims only what the operator assigned."""
        key = answer["trial_key"]
        dedicated = WORKER_MARK not in name
        if key is not None and (not key.startswith(prefix) or key.count("/") != 2
                                or (dedicated and name != actor_name(key))):
            raise AnswerError("rejected", f"it claims trial {key[:200]!r}, which is not the one its name "
                                          "was given for")
        pool_key = answer["pool_key"]
        if (pool_key != "") if dedicated else not pool_key.startswith(prefix):
            raise AnswerError("rejected", f"its pool key {answer['pool_key'][:200]!r} does not match its name")
        shape_info = answer["shape"]
        try:
            shape = TrialResources.of({k: v for k, v in shape_info.items() if k != "pg"})
        except Exception as exc:  # noqa: BLE001 - any bad shape is a bad answer
            raise AnswerError("rejected", f"its shape is invalid: {str(exc)[:200]}") from None
        group = shape_info.get("pg")
        if group is not None and (not isinstance(group, str) or not group.startswith(name)):
            raise AnswerError("rejected", "its placement group is not its own")
        return Worker(name, handle, shape, answer["pool_key"], node_id=answer["node_id"],
                      placement_group=group, namespace=experiment_namespace(self.namespace, prefix))

    def _adopt(self, name: str, worker: Worker, answer: dict) -> None:
        idle = end = False
        with self._lock:
            key = answer["trial_key"]
            if key is not None and key not in self._slots:
                self._slots[key] = Slot(worker, answer["attempt"])
            elif key is not None and self._slots[key].worker.name != name:
                # it answered too late: the trial was started again elsewhere meanwhile
                log.warning("actor %s also hosts %s, which runs on %s: ending it", name, key,
                            self._slots[key].worker.name)
                end = True
            elif key is None and worker.pool_key and not answer["stray_threads"]:
                idle = True
            elif key is None:
                # a dedicated actor hosting nothing (a leftover), or a worker still running
                # threads of its last trial (retired, see trainable/host.py)
                end = True
        # outside the lock: killing an actor, or giving a worker back (which asks Ray for
        # the cluster's size), waits for as long as Ray is down, and poll needs the lock
        if end:
            self._pool.kill(worker)
        elif idle:
            self._pool.give_back(worker)

    def unknown_update(self, key: str) -> TrialUpdate:
        """The update of a trial no known actor hosts: running while an actor of its
        experiment has not answered yet, else missing."""
        with self._lock:
            seen = self._discovered.get(experiment_prefix(key))
            starting = seen is not None and bool(self._unanswered(seen, key))
            ended = [why for name, why in seen.ended.items() if could_host(name, key)] if seen is not None else []
        if starting:   # an actor of that experiment has not answered yet: maybe it hosts it
            return TrialUpdate(key, TrialState.RUNNING)
        if ended:      # kubetune ended it unanswered: not the cluster's doing, nor the trial's
            return TrialUpdate(key, TrialState.MISSING, cluster_fault=True, error=ended[0])
        return TrialUpdate(key, TrialState.MISSING, cluster_fault=True, error=(
            f"no Ray actor hosts trial {key} (Ray namespace {self.namespace!r}): "
            "the Ray cluster restarted or the actor was removed"))

    def forget(self, prefix: str) -> None:
        """Drop what was learnt under a trial-key prefix (its actors were killed)."""
        with self._lock:
            for discovered in [k for k in self._discovered if k.startswith(prefix)]:
                del self._discovered[discovered]
