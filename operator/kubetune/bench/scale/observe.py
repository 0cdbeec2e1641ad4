"""Apply the planned Experiments and watch what happens to them, as a user would see it.

One watch on Experiments and one on Trials, cluster-wide (a paginated LIST first, then
WATCH from its resourceVersion; a LIST again when the watch is too old): the bench's
own load on the API server stays a few requests, whatever the size, and is counted in
``own_requests`` so that the apiserver's totals can be told apart from the operator's.
Times are this process's wall clock when an event arrived."""
from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kubetune.bench.scale.shapes import GROUP, VERSION, Planned

FINAL_TRIAL_PHASES = frozenset({"Succeeded", "Failed", "Stopped"})
FINAL_EXPERIMENT_PHASES = frozenset({"Succeeded", "Failed"})
NOT_STARTED = frozenset({"", "Pending", "Queued"})
PAGE = 500
WATCH_SECONDS = 30


@dataclass
class TrialSeen:
    experiment: str                  # "<namespace>/<experiment>"
    first_seen: float
    phase: str = ""
    phases: dict[str, float] = field(default_factory=dict)   # phase -> first seen in it


@dataclass
class ExperimentSeen:
    applied: float | None = None
    phase: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    first_trial: float | None = None       # a Trial of it was first seen
    first_started: float | None = None     # a Trial of it was first seen past Pending/Queued
    finished_trials: int = 0               # its Trials seen in a final phase
    progress: list[float] = field(default_factory=list)   # a Trial appeared or changed phase


def list_all(custom, plural: str, *, namespace: str | None = None, label_selector: str = "",
             count: Callable[[str], None] = lambda verb: None) -> tuple[list[dict], str]:
    """Every object, ``PAGE`` at a time (as kubectl does); returns (items, resourceVersion)."""
    items: list[dict] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {"limit": PAGE, "label_selector": label_selector}
        if token:
            kwargs["_continue"] = token
        if namespace:
            page = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural, **kwargs)
        else:
            page = custom.list_cluster_custom_object(GROUP, VERSION, plural, **kwargs)
        count("LIST")
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items, page["metadata"]["resourceVersion"]


class Observer:
    def __init__(self, api_client, log: Callable[[str], None] = print) -> None:
        import kubernetes
        self._kubernetes = kubernetes
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.log = log
        self.lock = threading.Lock()
        self.trials: dict[str, TrialSeen] = {}
        self.experiments: dict[str, ExperimentSeen] = collections.defaultdict(ExperimentSeen)
        self.own_requests: collections.Counter[str] = collections.Counter()   # "<resource> <VERB>"
        self.last_event = 0.0                  # when the last watch event arrived
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ applying

    def apply(self, planned: Iterable[Planned], runs_dir: str = "", threads: int = 8) -> None:
        """Create the namespaces, then every Experiment at once (``threads`` requests in
        flight); each Experiment's apply time is when its create was sent."""
        planned = list(planned)
        for namespace in sorted({p.namespace for p in planned}):
            self.ensure_namespace(namespace)

        def create(p: Planned) -> None:
            sent = time.time()
            self.custom.create_namespaced_custom_object(GROUP, VERSION, p.namespace, "experiments",
                                                        p.body(runs_dir))
            with self.lock:
                self.own_requests["experiments POST"] += 1
                self.experiments[p.key].applied = sent

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, planned))

    def ensure_namespace(self, namespace: str) -> None:
        from kubernetes.client.exceptions import ApiException
        try:
            self.core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as error:
            if error.status != 409:
                raise
        with self.lock:
            self.own_requests["namespaces POST"] += 1

    # ------------------------------------------------------------ watching

    def start(self) -> "Observer":
        for plural, handle in (("experiments", self._on_experiment), ("trials", self._on_trial)):
            thread = threading.Thread(target=self._follow, args=(plural, handle), daemon=True,
                                      name=f"observe-{plural}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(WATCH_SECONDS + 10)

    def _count(self, plural: str) -> Callable[[str], None]:
        def count(verb: str) -> None:
            with self.lock:
                self.own_requests[f"{plural} {verb}"] += 1
        return count

    def _follow(self, plural: str, handle: Callable[[dict, float], None]) -> None:
        from kubernetes.client.exceptions import ApiException
        count = self._count(plural)
        version = None
        while not self._stop.is_set():
            try:
                if version is None:
                    items, version = list_all(self.custom, plural, count=count)
                    now = time.time()
                    for item in items:
                        handle(item, now)
                stream = self._kubernetes.watch.Watch()
                count("WATCH")
                for event in stream.stream(self.custom.list_cluster_custom_object, GROUP, VERSION, plural,
                                           resource_version=version, timeout_seconds=WATCH_SECONDS,
                                           allow_watch_bookmarks=True, _request_timeout=WATCH_SECONDS + 30):
                    obj = event["object"]
                    if event["type"] == "ERROR":          # e.g. 410: too old a resourceVersion
                        version = None
                        break
                    version = obj["metadata"]["resourceVersion"]
                    self.last_event = time.time()
                    if event["type"] in ("ADDED", "MODIFIED"):
                        handle(obj, time.time())
                    if self._stop.is_set():
                        stream.stop()
                        break
            except ApiException as error:
                if error.status == 410:
                    version = None
                else:
                    self.log(f"watch {plural}: {error.status} {error.reason}; again in 1 s")
                    self._stop.wait(1.0)
            except Exception as error:  # noqa: BLE001 - a dropped connection: watch again
                self.log(f"watch {plural}: {type(error).__name__}: {error}; again in 1 s")
                self._stop.wait(1.0)

    def _on_experiment(self, obj: dict, now: float) -> None:
        meta = obj["metadata"]
        phase = (obj.get("status") or {}).get("phase") or ""
        with self.lock:
            seen = self.experiments[f"{meta['namespace']}/{meta['name']}"]
            seen.phase = phase
            if phase in FINAL_EXPERIMENT_PHASES and phase not in seen.phases:
                # finishing is progress: one whose trials all ended before a restart
                # only turns Succeeded after it, with no Trial changing
                seen.progress.append(now)
            seen.phases.setdefault(phase, now)

    def _on_trial(self, obj: dict, now: float) -> None:
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        phase = (obj.get("status") or {}).get("phase") or ""
        with self.lock:
            seen = self.trials.get(key)
            experiment = self.experiments[f"{meta['namespace']}/{obj['spec']['experiment']}"]
            if seen is None:
                seen = self.trials[key] = TrialSeen(f"{meta['namespace']}/{obj['spec']['experiment']}", now)
                experiment.progress.append(now)
                if experiment.first_trial is None:
                    experiment.first_trial = now
            if phase not in seen.phases:
                seen.phases[phase] = now
                experiment.progress.append(now)
                if phase in FINAL_TRIAL_PHASES and seen.phase not in FINAL_TRIAL_PHASES:
                    experiment.finished_trials += 1
            if phase not in NOT_STARTED and experiment.first_started is None:
                experiment.first_started = now
            seen.phase = phase

    # ------------------------------------------------------------ questions

    def quiet(self, seconds: float, timeout_s: float = 60.0) -> bool:
        """Wait until no watch event arrived for ``seconds`` (at most ``timeout_s``): once
        the operator is killed, what still arrives was written before it died."""
        deadline = time.monotonic() + timeout_s
        while time.time() - self.last_event < seconds:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def trials_finished(self, keys: Iterable[str]) -> int:
        """Trials of these Experiments seen in a final phase."""
        with self.lock:
            return sum(self.experiments[key].finished_trials for key in keys)

    def finished(self, keys: Iterable[str]) -> int:
        with self.lock:
            return sum(1 for key in keys if self.experiments[key].phase in FINAL_EXPERIMENT_PHASES)

    def first_progress_after(self, moment: float, keys: Iterable[str]) -> dict[str, float | None]:
        """Per Experiment, when it was first seen making progress after ``moment``
        (None: not yet); an Experiment already finished by then is left out."""
        answer: dict[str, float | None] = {}
        with self.lock:
            for key in keys:
                seen = self.experiments[key]
                done_at = min((t for p, t in seen.phases.items() if p in FINAL_EXPERIMENT_PHASES), default=None)
                if done_at is not None and done_at <= moment:
                    continue
                answer[key] = next((t for t in seen.progress if t > moment), None)
        return answer
