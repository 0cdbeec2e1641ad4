"""ExperimentController: drives one Experiment's TrialRunner against a Ray cluster
and persists what happens through a Store.

The runner (core/) decides; this class carries the decisions out in order — a Trial
resource is created before anything is launched for it — feeds results and
terminations back, and writes status coalesced (controller/coalesce.py)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any, Callable, Mapping

from kubetune import metrics
from kubetune.controller import render, restore, warm_start
from kubetune.controller.clusters import ClusterHandle, ClusterRegistry, RayAddressRefused
from kubetune.controller.result_notes import ResultNotes
from kubetune.controller.coalesce import WriteCoalescer
from kubetune.controller.platform_queue import PlatformQueue
from kubetune.controller.results_recorder import RecordingStore, ResultsRecorder
from kubetune.controller.conditions import parse_rfc3339
from kubetune.controller.outcomes_status import warm_start_condition
from kubetune.controller.merge_patch import merge_patch
from kubetune.controller.status_events import status_events
from kubetune.controller.store import Store
from kubetune.k8s.errors import StaleTrial, WriteRefused
from kubetune.controller.write_failures import SURFACE_AFTER, WriteFailures, backoff
from kubetune.core import admission
from kubetune.core.runner import TrialRunner
from kubetune.core.schedulers import scheduler_class
from kubetune.core.search import warm_trials
from kubetune.core.sanitize import cap_text
from kubetune.core.types import (CreateTrial, FinishExperiment, LaunchTrial, PauseTrial,
                                 StopTrial, TrialPhase)
from kubetune.executors.base import LaunchRequest, RayUnavailableError
from kubetune.results.study_meta import experiment_link
from kubetune.spec import ExperimentSpec, SpecError, parse_experiment
from kubetune.spec.trial_key import TrialKey

log = logging.getLogger(__name__)

TRIAL_METRICS_WRITE_INTERVAL = 2.0      # seconds between metric-only writes of one Trial
TRIAL_START_WRITE_DELAY = 1.0           # a trial's Running is written this late: short trials get one write
EXPERIMENT_WRITE_INTERVAL = 1.0         # seconds between summary writes of the Experiment
IDLE_POLL_SECONDS = 0.25                # longest pause between polls of running trials
# A poll waits this long for the first trial with news and leaves the other fetches in
# flight for the next one: a slow actor no longer holds up the cycle, and an actor is
# called about once per batch of results instead of once per cycle (issue 7 benchmarks)
POLL_WAIT_SECONDS = 0.05
# longest a trial's stop, pause or failure waits for the results store to take its results
RESULTS_SETTLE_SECONDS = 2.0


# seconds between comparisons of what runs with what should (more often after a stop)
RECONCILE_RUNS_SECONDS = 10.0
FINISH_WAITS_FOR_TRIALS_S = 30.0


@dataclasses.dataclass
class _Effect:
    """A decision to carry out, retried with backoff until it holds."""
    decision: Any
    attempts: int = 0
    retry_at: float = float("-inf")

    def failed(self, error: Exception, now: float) -> None:
        self.attempts += 1
        self.retry_at = now + backoff(self.attempts)


def forbidden_message(error: Exception) -> str:
    """The API's own words for a 403, which name the verb, resource and group the
    operator's ServiceAccount lacks (``pods is forbidden: User "..." cannot list
    resource "pods" in API group "" in the namespace "ml"``), and what to do."""
    body = getattr(error, "body", None) or ""
    try:
        text = json.loads(body).get("message") or ""
    except (ValueError, AttributeError):
        text = str(body)
    return cap_text(f"missing permission: {text or error}; grant it to the operator's ServiceAccount "
                    "(charts/kubetune RBAC values)")


class ExperimentController:
    def __init__(self, *, namespace: str, name: str, store: Store, registry: ClusterRegistry,
                 body: Callable[[], Mapping[str, Any]], clock: Callable[[], float] = time.time,
                 checkpoint_storage: str = "", on_cycle: Callable[["ExperimentController"], None] | None = None,
                 results: ResultsRecorder | None = None, dashboard_url: str = "") -> None:
        self.namespace = namespace
        # status.dashboard: this Experiment's page in the chart's dashboard, when it has one
        self._dashboard = experiment_link(dashboard_url, namespace, name) if dashboard_url else None
        self.name = name
        # every accepted result and failed attempt also goes to the results store
        # (kubetune.results); Trial and Experiment metadata follow the status writes
        self.results = results
        self.store = RecordingStore(store, results) if results is not None else store
        self.registry = registry
        self._body = body
        self._clock = clock
        self._default_storage = checkpoint_storage
        self._on_cycle = on_cycle
        self._result_notes = ResultNotes(name)    # what the Trial's status cuts, said once per trial
        self.spec: ExperimentSpec | None = None
        self.runner: TrialRunner | None = None
        self.cluster: ClusterHandle | None = None
        self._generation: int | None = None
        self._trial_writes = WriteCoalescer(TRIAL_METRICS_WRITE_INTERVAL, start_phase=TrialPhase.RUNNING.value,
                                            start_delay=TRIAL_START_WRITE_DELAY)
        self._experiment_written: dict[str, Any] = {}
        self._experiment_written_at = float("-inf")
        self._touched: set[str] = set()
        self._spec_problem: tuple[str, str] | None = None   # (reason, message) shown as a condition
        self._scheduler_warned = False
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._platform_queue = PlatformQueue()   # launched pods the kube-scheduler cannot place yet
        # ended trials whose checkpoints go (checkpoint.deleteOnCompletion) -> announce it
        self._checkpoints_to_delete: dict[str, bool] = {}
        self._orphans_checked = False   # actors of trials that ended while no operator watched
        self._finished_at_start = False  # found finished for its spec: kept so, not restored
        self._cloned: dict[str, tuple[str, str | None]] = {}   # trial -> (donor's checkpoint, its own copy)
        self._unstored: dict[str, int] = {}   # after a restart: trial -> last seq to check in the results store
        # what runs is compared with what should at start-up, after stops, and every
        # RECONCILE_RUNS_SECONDS; runs found that should not (and did not end): no launch
        self._check_runs_at = float("-inf")
        self._runs_to_end: list[str] = []
        self._effects: list[_Effect] = []   # decisions not yet carried out (see _apply)
        self._in_cycle = False
        self._applying = False
        self._write_failures = WriteFailures()
        self._finished_at: float | None = None   # when the finished status first waited for Trial writes
        self._blocked: tuple[str, str] | None = None   # (reason, message): e.g. a missing permission
        self._warm_sources: list[dict[str, Any]] | None = None   # status.warmStartSources (warm_start.py)

    # ------------------------------------------------------------------ lifecycle

    def wake(self) -> None:
        """Something changed (spec edit, deletion): run a cycle now."""
        self._wakeup.set()

    async def run(self, stopped: Callable[[], bool]) -> None:
        """The reconcile loop; returns when ``stopped()`` turns true.  It never raises:
        a cycle that fails is logged, surfaced on the Experiment and retried with
        backoff (kopf would restart a raising daemon every 60 s with the same state)."""
        idle = 0.01
        failures = 0
        while not stopped() and not self._stopping:
            try:
                self._in_cycle = True
                busy = await self.reconcile_once()
                failures = 0
                if self._blocked is not None:
                    self._blocked = None
                    await self._flush_guarded()
            except Exception as error:  # noqa: BLE001 - see the docstring
                failures += 1
                busy = False
                await self._cycle_failed(error, failures)
                idle = backoff(failures)
            else:
                idle = 0.01 if busy else min(idle * 2, IDLE_POLL_SECONDS if self._has_active() else 2.0)
            self._in_cycle = False
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=idle)
            except asyncio.TimeoutError:
                pass
        await self._flush_guarded(force=True)

    async def _flush_guarded(self, *, force: bool = False) -> None:
        try:
            await self.flush(force=force)
        except Exception as error:  # noqa: BLE001 - logged; the loop goes on or is ending
            log.warning("%s/%s: status not written: %s", self.namespace, self.name, error)

    async def _cycle_failed(self, error: Exception, failures: int) -> None:
        """A reconcile cycle raised.  A missing permission (403) is a Failed condition
        naming it; anything else a Warning Event the first time; both are retried."""
        metrics.reconcile_error(type(error).__name__)
        status = getattr(error, "status", None)
        if failures == 1:
            log.exception("%s/%s: reconcile failed; retrying with backoff", self.namespace, self.name)
        if status == 403:
            message = forbidden_message(error)
            if self._blocked != ("Forbidden", message):
                self._blocked = ("Forbidden", message)
                if self.runner is None:     # nothing rendered yet: the condition alone
                    generation = self._body().get("metadata", {}).get("generation")
                    await self._fail_invalid_spec(message, generation, reason="Forbidden")
                else:
                    await self._event_guarded("Warning", "Forbidden", message)
            await self._flush_guarded()
        elif failures == 1:
            await self._event_guarded("Warning", "ReconcileError", f"{type(error).__name__}: {error}")

    async def _event_guarded(self, kind: str, reason: str, message: str) -> None:
        try:
            await self.store.event(kind, reason, message)
        except Exception as error:  # noqa: BLE001 - an Event is a courtesy
            log.warning("%s/%s: event %s not posted: %s", self.namespace, self.name, reason, error)

    async def _trial_event_guarded(self, trial: str, reason: str, message: str) -> None:
        try:
            await self.store.trial_event(trial, "Warning", reason, message[:1000])
        except Exception as error:  # noqa: BLE001 - an Event is a courtesy
            log.warning("%s/%s: event %s on %s not posted: %s", self.namespace, self.name, reason, trial, error)

    def stop(self) -> None:
        """End the loop (its trials keep running)."""
        self._stopping = True
        self.wake()

    async def release_resources(self) -> None:
        """The Experiment is gone and its trials ended (controller.operator_state): give
        back what they held in the shared ledger, and withdraw their autoscaler demand."""
        self.stop()
        if self.cluster is None:
            return
        if self.runner is not None:
            for name in list(self.runner.active_trials()):
                self.cluster.ledger.release(self._trial_key(name))
        if isinstance(self.cluster, ClusterHandle):
            # its queued demand goes with it, even if no other Experiment runs a cycle
            await self.cluster.sync_autoscaler_request()

    @property
    def written_status(self) -> Mapping[str, Any]:
        """The Experiment status as last written (or restored); read by kubetune.metrics."""
        return self._experiment_written

    def _has_active(self) -> bool:
        return self.runner is not None and bool(self.runner.active_trials())

    def needs_ray(self) -> str | None:
        """The Ray address whose connection this controller needs now, or None: it runs
        on none, or it has finished with nothing left to do there (see ``_done_with_ray``).
        Read by the operator to end driver processes nobody needs (controller/clusters.py)."""
        if not isinstance(self.cluster, ClusterHandle) or self._stopping:
            return None
        if self._in_cycle:
            return self.cluster.address
        if self.runner is None:     # finished before a restart, or a spec that never ran
            return self.cluster.address if self._finished_at_start and not self._orphans_checked else None
        return None if self._done_with_ray() else self.cluster.address

    def _done_with_ray(self) -> bool:
        """Finished, nothing of it runs on Ray (its actors were ended), nothing owed: its
        cycles make no Ray call until a spec change reopens it."""
        runner = self.runner
        return (isinstance(self.cluster, ClusterHandle) and runner is not None and runner.finished is not None
                and not runner.active_trials() and self._orphans_checked and not self._unstored
                and not self._runs_to_end and not self._effects)

    # ------------------------------------------------------------------ one cycle

    async def reconcile_once(self) -> bool:
        """One pass: spec changes, launches, results. True if anything happened."""
        body = self._body()
        generation = body.get("metadata", {}).get("generation")
        if generation != self._generation:
            await self._take_spec(body, generation)
        if self.runner is None:
            if self._finished_at_start and not self._orphans_checked:
                await self._stop_runs_of_finished()
            await self.flush()
            return False
        if self.runner.finished is not None and not self.runner.active_trials() and not self._orphans_checked:
            await self._stop_runs_of_finished()     # e.g. restored finished after a spec change
        if self._done_with_ray():
            # no Ray call: an idle connection may end (its driver process, clusters.py)
            if self._checkpoints_to_delete:
                await self._delete_checkpoints()
            await self.flush()
            return False
        if not await self.cluster.ensure_connected():
            await self.flush()
            return False
        now = self._clock()
        busy = False
        try:
            await self._reconcile_runs(now)
            await self.cluster.refresh_capacity()
            busy |= await self._apply(self.runner.step(now))
            if self._unstored:
                await self._store_results_taken_before_restart()
            if await self._poll_running():
                busy = True
                # fill the slots of trials that just ended now, not one cycle later
                await self._apply(self.runner.step(self._clock()))
        except Exception as error:  # a Ray call failing mid-cycle: reconnect, keep the trials
            if not self._is_connection_error(error):
                raise
            metrics.reconcile_error("RayUnavailable")
            self.cluster.mark_unavailable(error)
        if self._checkpoints_to_delete:
            await self._delete_checkpoints()
        await self.flush()
        if self._on_cycle is not None:
            self._on_cycle(self)
        return busy

    async def _take_spec(self, body: Mapping[str, Any], generation: int | None) -> None:
        now = self._clock()
        try:
            # off the event loop: a spec is bounded (spec/parse.py), yet every Experiment's
            # writes and the Lease wait for nothing one tenant sends (issue 25)
            spec = await asyncio.to_thread(parse_experiment, body.get("spec") or {})
            scheduler_class(spec)    # the scheduler's own checks: its name, what it needs
        except SpecError as error:
            self._generation = generation
            if self.runner is None:
                await self._fail_invalid_spec(str(error), generation)
            else:   # keep running the last valid spec; say why the edit was not taken
                self._spec_problem = ("InvalidSpec", str(error))
                await self._event_guarded("Warning", "InvalidSpec", str(error))
            return
        refused = await self._pod_policy_refusal(spec)
        if refused:
            self._generation = generation
            if self.runner is None:
                await self._fail_invalid_spec(refused, generation, reason="PodSecurityViolation")
            else:   # keep running the last allowed spec
                self._spec_problem = ("PodSecurityViolation", refused)
                await self.store.event("Warning", "PodSecurityViolation", refused)
            return
        self._spec_problem = None
        if self.runner is None:
            address = self.registry.resolve(spec.ray.address)
            try:
                self.cluster = self.registry.pods() if spec.executor == "pod" else self.registry.get(address)
            except RayAddressRefused as error:
                self._generation = generation
                await self._fail_invalid_spec(str(error), generation, reason="RayAddressRefused"
                                              if spec.executor == "ray" else "PodExecutorUnavailable")
                return
            if restore.finished_and_unchanged(body.get("status") or {}, generation):
                # finished stays finished: no restore, no trial; a spec change restores it
                self._experiment_written = dict(body.get("status") or {})
                self._finished_at_start = True
            else:
                await self._restore(spec, body, now)
        else:
            await self._apply(self.runner.on_spec_changed(spec, now))
            rejection = getattr(self.runner, "spec_rejection", None)
            if rejection:
                self._spec_problem = ("SpecChangeRejected", rejection)
                await self._event_guarded("Warning", "SpecChangeRejected", rejection)
        self.spec = spec
        self._generation = generation

    async def _restore(self, spec: ExperimentSpec, body: Mapping[str, Any], now: float) -> None:
        """Rebuild from the Trial resources: a restarted operator continues the same run."""
        status = body.get("status") or {}
        start_time = parse_rfc3339(status["startTime"]) if status.get("startTime") else now
        warm, notes = await self._warm_start(spec, status)
        try:
            runner, trials = await restore.rebuild(
                spec, experiment=self.name, owner=self._trial_key(""), start_time=start_time, status=status,
                generation=body.get("metadata", {}).get("generation"), list_trials=self.store.list_trials,
                warm_start=warm, warm_start_notes=notes)
        except SpecError as error:   # e.g. a search algorithm whose package is missing
            await self._fail_invalid_spec(str(error), self._body().get("metadata", {}).get("generation"))
            return
        runner.attach_ledger(self.cluster.ledger)
        self.runner = runner
        # before the first poll: a donor's retention keeps what the operator has not yet seen
        for name in list(runner.trials):
            await self._clone_checkpoint(name, spec)
        for trial in trials:
            # what is persisted is not rewritten; its first change goes out at once, not an
            # interval after the restart: after a failover the Trials show progress again
            # as soon as the new leader has any (the old leader's last write is of unknown age)
            self._trial_writes.seed(trial["metadata"]["name"], trial.get("status") or {}, float("-inf"))
        if spec.checkpoint.delete_on_completion:   # idempotent: an earlier run may have done it
            self._checkpoints_to_delete.update((name, False) for name, trial in runner.trials.items()
                                               if trial.phase.is_terminal and trial.checkpoint)
        self._experiment_written = dict(status)
        if self.results is not None:
            self._unstored = {name: trial.last_seq for name, trial in runner.trials.items()
                              if trial.phase is TrialPhase.RUNNING and trial.last_seq >= 0}
        if trials:
            log.info("%s/%s: restored %d trials", self.namespace, self.name, len(trials))
        if runner.searcher.warm_start_problems and not trials:   # once, not at every restart
            outcomes = runner.summary(now).outcomes
            for _, _, reason, message in warm_start_condition(outcomes, True):
                await self._event_guarded("Warning", reason, message)

    async def _warm_start(self, spec: ExperimentSpec, status: Mapping[str, Any]) -> tuple[list, list[str]]:
        """The succeeded trials of the Experiments ``spec.warmStart`` names, and what was
        not found: at the first start as they are, and recorded; after a restart the same
        trials again (controller/warm_start.py)."""
        if spec.warm_start is None:
            return [], []
        recorded = {source.get("experiment"): source for source in status.get("warmStartSources") or ()}
        first_start = "warmStartSources" not in status
        warm, notes, sources = [], [], []
        for experiment in spec.warm_start.experiments:
            if experiment == self.name:
                notes.append(f"{experiment}: is this Experiment")
                continue
            listed = await self.store.list_trials_of(experiment)
            gone = ""
            if first_start or experiment not in recorded:
                source, chosen = warm_start.snapshot(experiment, listed)
            else:
                source = recorded[experiment]
                chosen, gone = warm_start.select(source, listed)
            sources.append(source)
            found = warm_trials(experiment, [render.trial_record(t) for t in chosen])
            if gone or not found:
                notes.append(gone or f"{experiment}: no succeeded Trials in namespace {self.namespace}")
            warm += found
        self._warm_sources = sources
        return warm, notes

    async def _pod_policy_refusal(self, spec) -> str:
        """What a pod template asks for beyond what this operator and namespace allow
        (spec/pod_policy.py), each naming its field; "" when nothing."""
        pods = self.registry.pod_cluster
        if spec.executor != "pod" or pods is None:
            return ""
        return "; ".join(await pods.policy_violations(self.namespace, spec.trial.template, spec.priority_class))

    async def _fail_invalid_spec(self, message: str, generation: int | None, *,
                                 reason: str = "InvalidSpec") -> None:
        now = self._clock()
        previous = self._experiment_written
        status = render.refused_status(previous, reason, message, now=now, generation=generation)
        if await self._write("Experiment", self.store.patch_experiment_status(status)):
            self._experiment_written = {**previous, **status}
        await self._event_guarded("Warning", reason, message)

    # ------------------------------------------------------------------ decisions

    async def _apply(self, decisions: list) -> bool:
        """Queue the runner's decisions as effects and carry out what can be now.

        Effects are level-triggered (issue 15): each is idempotent (a Trial created
        twice is the same Trial; a launch attaches to a run that exists; a stop of a
        stopped run does nothing), so one that fails stays queued and is retried with
        backoff until it holds, and the effects after it are not lost.  A trial's
        effects hold in order (its launch waits for its Trial to exist).  No launch
        goes out while a run the runner stopped or paused may still hold its slot
        (``_runs_to_end``): see ``_reconcile_runs``."""
        self._effects.extend(_Effect(decision) for decision in decisions)
        if not self._applying:   # a nested call (a failed launch's retry) joins the loop below
            self._applying = True
            try:
                await self._carry_out_effects()
            finally:
                self._applying = False
        return bool(decisions)

    async def _carry_out_effects(self) -> None:
        now = self._clock()
        waiting: set[str] = set()     # trials with an effect not yet held
        index = 0
        while index < len(self._effects):
            effect = self._effects[index]
            name = getattr(effect.decision, "name", "")
            launch = isinstance(effect.decision, LaunchTrial)
            if launch and self._check_runs_at == float("-inf") and name not in waiting:
                await self._reconcile_runs(now)     # a stop or pause went out: did it hold?
            held_back = name in waiting or now < effect.retry_at or launch and bool(self._runs_to_end)
            if not held_back:
                try:
                    await self._carry_out(effect.decision)
                except Exception as error:  # noqa: BLE001 - retried; see _apply
                    if self._is_connection_error(error):
                        self.cluster.mark_unavailable(error)
                    effect.failed(error, now)
                    log.warning("%s/%s: %s for %s failed (attempt %d, retrying): %s", self.namespace, self.name,
                                type(effect.decision).__name__, name, effect.attempts, error)
                    if effect.attempts == SURFACE_AFTER and not isinstance(error, StaleTrial):
                        await self._event_guarded("Warning", "EffectRetrying",
                                                  f"{type(effect.decision).__name__} {name}: {error}")
                else:
                    del self._effects[index]
                    continue
            if name:
                waiting.add(name)
            index += 1

    def _uncreated(self) -> set[str]:
        """Trials whose Trial resource is not created yet: no status is written for them
        (the API would answer 404, and the status would count as written)."""
        return {effect.decision.name for effect in self._effects if isinstance(effect.decision, CreateTrial)}

    def _pending_effects(self) -> set[str]:
        """Trials with an effect still to hold: not polled meanwhile (a launch not yet out
        has no run to ask about)."""
        return {getattr(effect.decision, "name", "") for effect in self._effects}

    async def _carry_out(self, decision: Any) -> None:
        name = getattr(decision, "name", "")
        if name:
            self._touched.add(name)
        if isinstance(decision, CreateTrial):
            await self._create_trial(decision)
        elif isinstance(decision, LaunchTrial):
            source, copy = self._cloned.get(decision.name, (None, None))
            if decision.checkpoint is not None and decision.checkpoint == source:
                decision = dataclasses.replace(decision, checkpoint=copy)   # decided before the copy
            await self._launch(decision)
        elif isinstance(decision, StopTrial):
            await self._stop(decision)
        elif isinstance(decision, PauseTrial):
            await self._pause(decision)
            if decision.clone_from:
                await self._clone_checkpoint(decision.name)
        elif isinstance(decision, FinishExperiment):
            kind = "Normal" if decision.phase == "Succeeded" else "Warning"
            await self._event_guarded(kind, decision.reason, decision.message)
            await self._stop_runs_of_finished()   # its pooled workers too: it holds nothing now
        # TrialPhaseChanged: written back with the trial's status

    async def _create_trial(self, decision: CreateTrial) -> None:
        body = render.trial_body(namespace=self.namespace, experiment=self._body(), name=decision.name,
                                 index=decision.index, params=decision.params,
                                 resources=(self._body().get("spec", {}).get("trial", {}) or {}).get("resources", {}))
        await self.store.create_trial(body)

    async def _launch(self, decision: LaunchTrial) -> None:
        spec = self.spec
        request = LaunchRequest(
            trial_key=self._trial_key(decision.name),
            entrypoint=spec.trial.entrypoint,
            config={**dict(spec.trial.config or {}), **dict(decision.params)},
            resources=spec.trial.resources,
            checkpoint=decision.checkpoint,
            start_iteration=decision.start_iteration,
            start_seq=decision.last_result_seq,
            attempt=decision.attempt,
            runtime_env=dict(spec.trial.runtime_env) if spec.trial.runtime_env else None,
            storage=spec.checkpoint.storage or self._default_storage,
            keep_last=spec.checkpoint.keep_last,
            keep_best=spec.checkpoint.keep_best,
            metric=spec.objective.metric,
            mode=spec.objective.mode,
            pod_template=spec.trial.template,
            metrics_collector=spec.trial.metrics_collector,
            queue=spec.queue,
            priority_class=spec.priority_class,
        )
        if spec.queue:
            # Kueue's webhook gates the pod as it is created: Queued from the start (a Trial
            # written now, or before the first poll, must not say Running)
            self._note_waiting(decision.name, admission.QUEUED, f"waiting for Kueue admission in queue {spec.queue}")
        now = self._clock()
        if decision.attempt > 0:
            # The new attempt, its start and the history cut back to its checkpoint are on
            # the Trial before it runs: a restarted operator resumes this attempt, not the last.
            await self._persist_trial(decision.name)
        try:
            await asyncio.to_thread(self.cluster.executor.start, request)
        except Exception as error:  # noqa: BLE001 - a failed launch is the trial's error, not ours
            cluster_fault = self._is_connection_error(error)
            if cluster_fault:
                self.cluster.mark_unavailable(error)
            await self._trial_errored(decision.name, f"launch failed: {type(error).__name__}: {error}", now,
                                      cluster_fault=cluster_fault)
            return
        self.runner.on_trial_launched(decision.name, now)
        if decision.attempt == 0 and not decision.checkpoint:
            await self._event_guarded("Normal", "TrialLaunched", f"{decision.name} launched with {dict(decision.params)}")
        else:
            await self._event_guarded("Normal", "TrialRelaunched",
                                   f"{decision.name} relaunched (attempt {decision.attempt}) from {decision.checkpoint or 'scratch'}")

    def _note_waiting(self, name: str, reason: str, message: str) -> None:
        """What the platform says a running trial waits for ("" : nothing), shown as Queued;
        a trial queued again after Kueue evicted it says Preempted."""
        trial = self.runner.trials.get(name)
        if trial is None:
            return
        since_eviction = trial.evictions > 0 and trial.admitted_attempt != trial.attempt
        if self._platform_queue.note(name, *admission.shown_waiting(reason, message, trial.evictions, since_eviction)):
            self._touched.add(name)

    async def _persist_trial(self, name: str) -> None:
        """Write a trial's status now, ahead of the side effect that follows (record intent
        first): an operator killed in between restarts from what it was about to do."""
        trial = self.runner.trials.get(name)
        if trial is None or name in self._uncreated():
            return
        status = self._trial_status(name)
        patch = merge_patch(self._trial_writes.last_written(name), status)
        if await self._write(f"Trial {name}", self.store.patch_trial_status(name, patch)):
            self._trial_writes.written(name, status, self._clock())
        else:   # the effect goes ahead (a stop frees its slot); the status is retried
            self._trial_writes.want(name, status)

    async def _pause(self, decision: PauseTrial) -> None:
        await self._settle_results()
        await self._persist_trial(decision.name)
        self._check_runs_at = float("-inf")
        trial = self.runner.trials[decision.name]
        update = await asyncio.to_thread(self.cluster.executor.pause, self._trial_key(decision.name),
                                         after_seq=trial.last_seq)
        recorded = trial.last_seq
        if update is not None and update.results:
            # what it reported up to its pausing checkpoint: it resumes from there
            self.runner.on_trial_paused(decision.name, update.results)
            self._record_results(decision.name, [r for r in update.results if recorded < r.seq <= trial.last_seq])
        if trial.last_seq != recorded:
            await self._persist_trial(decision.name)

    async def _clone_checkpoint(self, name: str, spec: ExperimentSpec | None = None) -> None:
        """A PBT exploit: copy the donor's checkpoint into the trial's own storage now, while
        the donor still keeps it (its retention keeps the checkpoints among results not yet
        acknowledged by the next poll), so the trial never continues from, or retries from,
        a checkpoint the donor has deleted meanwhile."""
        source = self.runner.borrowed_checkpoint(name)
        storage = (spec or self.spec).checkpoint.storage or self._default_storage
        if source is None or not storage:
            return
        from kubetune.checkpoints.storage import CheckpointOutsideStorage, clone_checkpoint_or_newer
        trial = self.runner.trials[name]
        try:
            copy = await asyncio.to_thread(clone_checkpoint_or_newer, source, storage, self._trial_key(name),
                                           trial.checkpoint_iteration)
        except CheckpointOutsideStorage as error:   # neither copied nor handed on: the trial starts afresh
            log.warning("%s/%s: %s refused for %s: %s", self.namespace, self.name, source, name, error)
            await self.store.trial_event(name, "Warning", "CheckpointRefused", f"{name}: {error}"[:1000])
            self.runner.on_checkpoint_cloned(name, source, None)
            self._cloned[name] = (source, None)    # a launch decided before this starts afresh too
            self._touched.add(name)
            return
        except Exception as error:  # noqa: BLE001 - storage the operator cannot reach: as before, the donor's
            log.warning("%s/%s: cannot copy %s for %s: %s", self.namespace, self.name, source, name, error)
            await self._event_guarded("Warning", "CheckpointNotCopied",
                                   f"{name}: continues from {source} in place (copy failed: {error})"[:1000])
            return
        if self.runner.on_checkpoint_cloned(name, source, copy):
            self._cloned[name] = (source, copy)
            self._touched.add(name)

    async def _reconcile_runs(self, now: float) -> None:
        """Compare what runs with what the runner wants running, and end the runs of trials
        that are over, paused or unknown: after a restart (the operator was killed
        between recording that and stopping them), and after any stop or pause, since
        an executor's stop may not hold (Ray unreachable for a moment).  Until such a run
        is gone, no launch goes out: a stopped trial must not keep its slot while
        another starts (issue 15: measured 3 running with parallelism 2).  Runs of
        active trials are left alone: launching the trial attaches to its run."""
        if now < self._check_runs_at:
            return
        keys = await asyncio.to_thread(self.cluster.executor.list_trials, self._trial_key(""))
        extra = [key for key in keys if not self._should_run(TrialKey.parse(key).trial)]
        for key in extra:
            log.info("%s/%s: stopping %s: its trial is not running", self.namespace, self.name, key)
            await asyncio.to_thread(self.cluster.executor.stop, key)
        if extra:
            keys = await asyncio.to_thread(self.cluster.executor.list_trials, self._trial_key(""))
            extra = [key for key in keys if not self._should_run(TrialKey.parse(key).trial)]
        self._runs_to_end = extra
        self._check_runs_at = now + (backoff(2) if extra else RECONCILE_RUNS_SECONDS)

    def _should_run(self, name: str) -> bool:
        trial = self.runner.trials.get(name)
        return trial is not None and not trial.phase.is_terminal and trial.phase is not TrialPhase.PAUSED

    async def _stop_runs_of_finished(self) -> None:
        """A finished Experiment has no live trial: end whatever still runs under it (an
        operator killed between finishing and stopping a trial)."""
        if not isinstance(self.cluster, ClusterHandle) or not await self.cluster.ensure_connected():
            self._orphans_checked = not isinstance(self.cluster, ClusterHandle)
            return
        if self.runner is not None and self.runner.active_trials():
            return      # reopened meanwhile (a spec change in the same cycle)
        stopped = await asyncio.to_thread(self.cluster.executor.stop_all, self._trial_key(""))
        if stopped:
            log.info("%s/%s: stopped %d actors of the finished experiment", self.namespace, self.name, stopped)
        # the trials it left queued are out of the ledger: withdraw their autoscaler demand
        # now, since a finished Experiment's cycles make no Ray call (_done_with_ray) and
        # the request stands until replaced (extra GPU nodes would stay up); retried next
        # cycle if it failed
        self._orphans_checked = await self.cluster.sync_autoscaler_request()

    async def _delete_checkpoints(self) -> None:
        """checkpoint.deleteOnCompletion: remove the checkpoints of ended trials, except
        those another trial is still to resume from (a PBT exploit)."""
        storage = self.spec.checkpoint.storage or self._default_storage
        if not storage:
            self._checkpoints_to_delete.clear()
            return
        from kubetune.checkpoints.storage import delete_trial_checkpoints
        needed = {self.runner.trials[name].checkpoint for name in self.runner.active_trials()}
        for name, announce in sorted(self._checkpoints_to_delete.items()):
            key = self._trial_key(name)
            if any(location and f"/{key}/" in location for location in needed):
                continue
            try:
                await asyncio.to_thread(delete_trial_checkpoints, storage, key)
            except Exception as error:  # noqa: BLE001 - storage trouble must not stop the experiment
                log.warning("%s/%s: cannot delete the checkpoints of %s: %s", self.namespace, self.name, name, error)
            else:
                if announce:   # not again for trials an earlier operator process ended
                    await self._event_guarded("Normal", "CheckpointsDeleted",
                                           f"{name}: its checkpoints were removed (checkpoint.deleteOnCompletion)")
            self._checkpoints_to_delete.pop(name, None)

    async def _stop(self, decision: StopTrial) -> None:
        await self._settle_results()
        await self._persist_trial(decision.name)
        self._check_runs_at = float("-inf")    # make sure it ended before the next launch
        await asyncio.to_thread(self.cluster.executor.stop, self._trial_key(decision.name))
        if self.spec.checkpoint.delete_on_completion:
            self._checkpoints_to_delete[decision.name] = True
        if decision.phase is TrialPhase.FAILED:
            await self._event_guarded("Warning", "TrialFailed", f"{decision.name}: {decision.reason}: {decision.message}")
        elif decision.phase is TrialPhase.STOPPED:
            await self._event_guarded("Normal", decision.reason or "TrialStopped", f"{decision.name}: {decision.message}")

    # ------------------------------------------------------------------ results

    async def _poll_running(self) -> bool:
        pending = self._pending_effects()
        running = [name for name in self.runner.running_trials() if name not in pending]
        if not running:
            return False
        cursors = {self._trial_key(name): self.runner.trials[name].last_seq for name in running}
        updates = await asyncio.to_thread(self.cluster.executor.poll, cursors, wait_s=POLL_WAIT_SECONDS)
        now = self._clock()
        busy = False
        for key, update in updates.items():
            name = TrialKey.parse(key).trial
            trial = self.runner.trials[name]
            if update.attempt is not None and update.attempt < trial.attempt:
                # The actor still holds the attempt before: the operator recorded the retry and
                # was killed before it started it. Start it now (the old run ends first).
                busy = True
                await self._launch(LaunchTrial(name, dict(trial.params), trial.checkpoint,
                                               trial.checkpoint_iteration if trial.checkpoint else 0,
                                               trial.attempt, trial.last_seq))
                continue
            self._note_waiting(name, update.waiting_reason, update.waiting_message)
            if update.awaiting_admission or update.queue_wait_s is not None:   # before its end, if it ended
                waits = trial.queue_waits
                await self._apply(self.runner.on_admission(name, update.awaiting_admission, now, update.queue_wait_s,
                                                           queue_full=update.queue_full))
                if trial.queue_waits != waits:
                    self._touched.add(name)
            if update.results:
                busy = True
                self._touched.add(name)
                metrics.results_processed(len(update.results))
                accepted = []
                for result in update.results:
                    await self._apply(self.runner.on_trial_result(name, result, now))
                    if trial.last_seq == result.seq:
                        accepted.append(result)
                self._record_results(name, accepted)
                for reason, text in self._result_notes.notes(name, accepted, trial.history_stride):
                    await self._trial_event_guarded(name, reason, text)   # once per trial: it was cut
            if update.state == "completed":
                busy = True
                await self._apply(self.runner.on_trial_completed(name, now))
            elif update.state == "failed":
                busy = True
                await self._trial_errored(name, update.error or "trial failed", now)
            elif update.state == "missing":
                busy = True
                await self._trial_errored(name, update.error or "trial's Ray actor is gone (worker or node died)",
                                          now, cluster_fault=bool(getattr(update, "cluster_fault", False)),
                                          evicted=getattr(update, "evicted", ""))
            if busy:
                self._touched.add(name)
        return busy

    def _record_results(self, name: str, results: list) -> None:
        """The results the runner took (a result of a run it already stopped or paused is
        not the trial's): to the results store, whose writer thread does the I/O."""
        if self.results is not None and results:
            self.results.results(name, results)

    async def _store_results_taken_before_restart(self) -> None:
        """After a restart: results the runner had taken (the Trial's lastResultSeq counts
        them) that the killed operator had not yet written to the results store are fetched
        again from the running trials, which keep a tail of fetched-past results
        (trainable/function_runner.py KEPT_ACKED_RESULTS), and stored; the runner never
        sees them twice."""
        try:
            stored = await asyncio.to_thread(self.results.stored_through, list(self._unstored))
        except Exception as error:  # noqa: BLE001 - store down: the condition says so; nothing to refetch against
            log.warning("%s/%s: results store unreadable, not checking for results lost in the restart: %s",
                        self.namespace, self.name, error)
            self._unstored = {}
            return
        # a trial is checked off only once done: a fetch that fails (Ray unreachable) leaves
        # it, and the ones after it, to the next cycle (the store is idempotent per seq)
        for name, last in list(self._unstored.items()):
            after, key = stored.get(name, -1), self._trial_key(name)
            while after < last:
                update = (await asyncio.to_thread(self.cluster.executor.poll, {key: after}, wait_s=0)).get(key)
                missing = [r for r in (update.results if update is not None else ()) if after < r.seq <= last]
                if not missing:
                    break
                self._record_results(name, missing)
                after = missing[-1].seq
            del self._unstored[name]

    async def _settle_results(self) -> None:
        """Before a trial's run ends (stop, pause, failure), and with it the only other copy
        of its results, let the results store take what it was handed: an operator killed
        after the Trial records the end must not lose them, since a restarted operator
        fetches missing results again only from runs still going.  Bounded; no wait at all
        while the store is failing (the Experiment's condition says so)."""
        if self.results is not None:
            await asyncio.to_thread(self.results.settle, RESULTS_SETTLE_SECONDS)

    async def _trial_errored(self, name: str, error: str, now: float, *, cluster_fault: bool = False,
                             evicted: str = "") -> None:
        """A failed attempt: its whole error to the results store, then to the runner."""
        trial = self.runner.trials.get(name)
        if self.results is not None and trial is not None and trial.phase is TrialPhase.RUNNING:
            self.results.failure(name, trial.attempt, evicted or ("ClusterFault" if cluster_fault else "Error"),
                                 error, now)
            await self._settle_results()
        if evicted:
            await self._event_guarded("Normal", "TrialEvicted", f"{name}: {error}")
        await self._apply(self.runner.on_trial_errored(name, error, now, cluster_fault=cluster_fault,
                                                       evicted=evicted))

    # ------------------------------------------------------------------ status

    async def flush(self, *, force: bool = False) -> None:
        """Write what changed: phases at once, metrics and the summary coalesced."""
        if self.runner is None:
            return
        now = self._clock()
        waiting = set()
        uncreated = self._uncreated()
        for name in self._touched:
            trial = self.runner.trials.get(name)
            if trial is None:
                continue
            if name in uncreated:
                waiting.add(name)
                continue
            # a change that keeps the phase is not written before the interval: render it
            # then (rendering a bounded status still costs more than a result)
            phase = self._platform_queue.trial_status(name, {"phase": trial.phase.value})["phase"]
            if not force and self._trial_writes.can_wait(name, phase, now):
                waiting.add(name)
                continue
            self._trial_writes.want(name, self._trial_status(name))
        self._touched = waiting
        for name, status in self._trial_writes.due(now, force=force):
            if not self._write_failures.ready(f"Trial {name}", now):
                continue       # backing off; the other Trials are written meanwhile
            patch = merge_patch(self._trial_writes.last_written(name), status)
            if await self._write(f"Trial {name}", self.store.patch_trial_status(name, patch)):
                self._trial_writes.written(name, status, now)
        await self._flush_experiment(now, force=force)

    async def _write(self, key: str, write: Any) -> bool:
        """Await one write; a refusal is recorded for backoff and surfaced, never raised."""
        try:
            await write
        except WriteRefused as error:
            metrics.status_write_failed(key.split(" ", 1)[0].lower() + "s", error.reason)
            log.warning("%s/%s: %s: status write refused: %s", self.namespace, self.name, key, error)
            if self._write_failures.failed(key, error, self._clock()):
                await self._event_guarded("Warning", "StatusWriteFailed", self._write_failures.condition()[1])
            return False
        self._write_failures.succeeded(key)
        return True

    async def _flush_experiment(self, now: float, *, force: bool) -> None:
        extra = []
        if self.cluster is not None:
            unavailable = bool(self.cluster.last_error)
            if unavailable or any(c.get("type") == "RayUnavailable"
                                  for c in self._experiment_written.get("conditions") or []):
                extra.append(("RayUnavailable", unavailable, "ConnectionFailed" if unavailable else "Connected",
                              self.cluster.last_error))
        if self.results is not None:
            extra += self.results.conditions(c.get("type") for c in self._experiment_written.get("conditions") or [])
        warning = self.runner.scheduler.warning()
        if warning:   # e.g. PBT whose function never checkpoints: it can never exploit
            extra.append(("SchedulerWarning", True, "SchedulerCannotAct", warning))
            if not self._scheduler_warned:   # the Event once; the condition keeps the count
                self._scheduler_warned = True
                await self._event_guarded("Warning", "SchedulerCannotAct", warning)
        runner_summary = self.runner.summary(now)
        extra += warm_start_condition(runner_summary.outcomes, self.spec.warm_start is not None)
        failed_writes = self._write_failures.condition()
        if failed_writes is not None:
            extra.append(("StatusWriteFailed", True, *failed_writes))
        elif any(c.get("type") == "StatusWriteFailed" for c in self._experiment_written.get("conditions") or []):
            extra.append(("StatusWriteFailed", False, "StatusWritten", ""))
        if self._spec_problem is not None:
            extra.append(("SpecRejected", True, *self._spec_problem))
        elif any(c.get("type") == "SpecRejected" for c in self._experiment_written.get("conditions") or []):
            extra.append(("SpecRejected", False, "SpecAccepted", ""))
        summary = self._platform_queue.summary(runner_summary, self.runner.trials)
        status = render.experiment_status(
            summary, total=self.spec.budget.max_trials, previous=self._experiment_written,
            generation=self._generation, now=now, suspended=self.spec.suspend, extra_conditions=extra,
            blocked=self._blocked,
            kept={"warmStartSources": self._warm_sources} if self._warm_sources is not None else None)
        if self._dashboard is not None:
            status["dashboard"] = self._dashboard
        if status == self._experiment_written:
            return
        phase_changed = status.get("phase") != self._experiment_written.get("phase")
        if not (force or phase_changed or now - self._experiment_written_at >= EXPERIMENT_WRITE_INTERVAL):
            return
        if not self._write_failures.ready("Experiment", now):
            return
        if summary.finished is not None and (self._uncreated() or any(
                not self._write_failures.surfaced(f"Trial {name}") for name in self._trial_writes.pending)):
            # Succeeded/Failed goes out after the Trials' final statuses (retried if the
            # API refused them), so `kubectl wait` never returns ahead of them; a Trial
            # write that keeps failing (shown as StatusWriteFailed) does not hold it, nor
            # anything for longer than FINISH_WAITS_FOR_TRIALS_S
            self._finished_at = self._finished_at if self._finished_at is not None else now
            if now - self._finished_at < FINISH_WAITS_FOR_TRIALS_S:
                return
        patch = merge_patch(self._experiment_written, status)
        if not await self._write("Experiment", self.store.patch_experiment_status(patch)):
            return
        for kind, reason, message in status_events(self._experiment_written, status):
            await self._event_guarded(kind, reason, message)
        self._experiment_written = status
        self._experiment_written_at = now

    # ------------------------------------------------------------------ helpers

    def _trial_status(self, name: str) -> dict[str, Any]:
        trial = self.runner.trials[name]
        return self._platform_queue.trial_status(name, render.trial_status(
            trial, objective=self.spec.objective.metric, decision_state=self.runner.decision_state(name)))

    def _trial_key(self, trial: str) -> str:
        return str(TrialKey(self.namespace, self.name, trial))

    def _is_connection_error(self, error: BaseException) -> bool:
        """The platform, not the trial, failed: the executor knows its own errors."""
        if isinstance(error, (ConnectionError, RayUnavailableError)):
            return True
        executor = getattr(self.cluster, "executor", None)
        return executor is not None and executor.is_unavailable(error)
