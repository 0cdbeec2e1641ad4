"""The study-detail API (``GET /api/studies/<id>?after=N``) from JSON made once per trial.

Opening a study's page fetches this with ``after=0``: every trial with every
intermediate value.  optuna-dashboard's own view converts each trial to JSON on each
request, which for an Experiment of 10,000 trials x 100 results (a million
intermediate values) takes tens of seconds, every time the page is opened.

A trial's JSON only changes when the trial does, and ``ResultsStoreStorage`` hands out
the same ``FrozenTrial`` object for a trial until it changes (it rebuilds only the
trials whose rows or results changed).  So each trial's JSON is made once, keyed by
that object, and a request joins the pieces it needs; a running Experiment costs only
the trials that changed.  The pieces are made by optuna-dashboard's own serializers
(``dashboard_compat``) but for the intermediate values, and encoded by orjson
(``trial_json``: a cold opening's largest cost); the search spaces are folded from a
few trials (``study_extras``).  The body parses to what its own view answers
(tests/unit/test_dashboard_json.py, against an Optuna RDBStorage holding the same
trials; tests/integration/test_dashboard_storage.py), so the page keeps working.

``StudyDetails.start`` makes every study's body in the background when the dashboard
starts and keeps it fresh.  That warm-up reads every result (~10 s for a million on an
idle machine, 40 s on a busy one), so with ``snapshots`` each body is also kept on disk
(``snapshot``): a dashboard that has just started serves the kept body of a study that
has not changed since, checked in a fraction of a second, and the first opening of a
big Experiment does not wait for the warm-up."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from kubetune.core.optuna_compat import trial_id
from kubetune.dashboard import dashboard_compat as odc
from kubetune.dashboard.gc_pause import collection_paused
from kubetune.dashboard.snapshot import Snapshots
from kubetune.dashboard.study_extras import extra_study_property
from kubetune.dashboard.trial_json import TrialEncoder

log = logging.getLogger(__name__)


REFRESH_SECONDS = 2.0       # a study's body older than this is served, and made again in the background
KEEP_SECONDS = 30.0         # every study's body is made again this often, looked at or not
STALE_LIMIT_SECONDS = 120.0  # a body older than this (the keeper late or failing) is made again first


@dataclass
class _Parts:
    """A study's body in pieces, as of ``made`` (monotonic seconds)."""
    trials: list[FrozenTrial] | None  # the trial list they were made from (None: read from a snapshot)
    ordered: list[bytes]             # every trial's JSON, by number
    best: list[bytes]                # the best trials' (or Pareto front's) JSON
    rest: bytes                      # the rest of the body, as JSON members
    made: float


@dataclass
class _Pieces:
    lock: threading.Lock = field(default_factory=threading.Lock)
    making: threading.Lock = field(default_factory=threading.Lock)   # one making of the body at a time
    system_attrs: dict[str, Any] | None = None                    # the study's, when the pieces were made
    by_id: dict[int, tuple[FrozenTrial, bytes]] = field(default_factory=dict)   # trial ID -> (trial, its JSON)
    parts: _Parts | None = None
    refreshing: bool = False
    saved_key: str | None = None      # the state the snapshot on disk is of
    seen_key: str | None = None       # the state at the keeper's last round
    looked: bool = False              # the snapshot was looked for


class StudyDetails:
    """``storage``: the dashboard's storage; ``app_cache``: the dashboard app's own
    cache (its trial list and search spaces), shared with its other views.

    A page opening or polling is answered from the study's last body when it is younger
    than STALE_LIMIT_SECONDS (and, when older than REFRESH_SECONDS, the body is made
    again in the background, so the page's next poll sees what changed).  A keeper
    thread makes every study's body at start (the warm-up) and again every KEEP_SECONDS,
    so a reader does not wait for the store, even after nobody looked for an hour; the
    price is reading each study's trial rows every KEEP_SECONDS (only the rows, once
    its finished trials have settled: see storage.py)."""

    def __init__(self, storage, app_cache, snapshots: Snapshots | None = None) -> None:
        self._storage = storage
        self._app_cache = app_cache
        self._snapshots = snapshots
        self._lock = threading.Lock()
        self._pieces: dict[int, _Pieces] = {}
        self._stopped = threading.Event()
        self.warmed = threading.Event()
        self.ready = threading.Event()   # every study has a body (kept on disk or made): /kubetune/ready
        self.warm_seconds: float | None = None

    def body(self, study_id: int, after: int = 0) -> bytes | None:
        """The response body, or None when there is no such study."""
        with self._lock:
            pieces = self._pieces.setdefault(study_id, _Pieces())
        parts = pieces.parts
        if parts is None and self._snapshots is not None:
            parts = self._from_snapshot(study_id, pieces)
        now = time.monotonic()
        if parts is None or now - parts.made >= STALE_LIMIT_SECONDS:
            parts = self._parts(study_id, newer_than=-math.inf if parts is None else parts.made)
        elif now - parts.made >= REFRESH_SECONDS:
            self._refresh_soon(study_id, pieces)
        if parts is None:
            return None
        pieces = [b'{"trials":[']   # one join of the ~50 MB of a big study, not one per list
        for trial in parts.ordered[after:]:
            pieces += (trial, b",")
        if len(pieces) > 1:
            pieces.pop()
        pieces.append(b'],"best_trials":[')
        for trial in parts.best:
            pieces += (trial, b",")
        if parts.best:
            pieces.pop()
        pieces += (b"],", parts.rest)
        return b"".join(pieces)

    def expire(self) -> None:
        """Treat every body as older than STALE_LIMIT_SECONDS, as a minute without readers
        does (the benchmark's re-opening after a pause)."""
        with self._lock:
            for pieces in self._pieces.values():
                if pieces.parts is not None:
                    pieces.parts.made = -math.inf

    def _refresh_soon(self, study_id: int, pieces: _Pieces) -> None:
        with self._lock:
            if pieces.refreshing:
                return
            pieces.refreshing = True

        def refresh() -> None:
            try:
                self._parts(study_id)
            except Exception:  # noqa: BLE001 - the next request that finds the body too old tries again
                log.exception("kubetune dashboard: refreshing study %s failed", study_id)
            finally:
                pieces.refreshing = False
        threading.Thread(target=refresh, name=f"dashboard-refresh-{study_id}", daemon=True).start()

    def _from_snapshot(self, study_id: int, pieces: _Pieces) -> _Parts | None:
        """The study's body kept on disk, when the store still holds what it was made of."""
        with pieces.lock:   # the keeper and a request may look at once: the file is read once
            if pieces.parts is not None or pieces.looked or self._snapshots is None:
                return pieces.parts
            pieces.looked = True
            if not self._snapshots.has(study_id):   # its key costs counting every result: not for nothing
                return None
            made = time.monotonic()
            key = self._storage.state_key(study_id)
            kept = self._snapshots.load(study_id, key) if key is not None else None
            if kept is None:
                return None
            ordered, best, rest = kept
            pieces.parts, pieces.saved_key = _Parts(None, ordered, best, rest, made), key
            log.info("kubetune dashboard: study %s served from its snapshot until its trials are read", study_id)
            return pieces.parts

    def _save(self, study_id: int, pieces: _Pieces) -> None:
        """Keep the study's body on disk once the state it was made of stayed the same for
        a keeper round (KEEP_SECONDS) and is not kept yet.  A running Experiment changes
        between rounds: its body, which a later start could not use anyway (its state
        will have moved on), is not written every round."""
        with pieces.lock:
            parts = pieces.parts
            if self._snapshots is None or parts is None or parts.trials is None:
                return
            key = self._storage.kept_key(study_id, parts.trials)
            settled, pieces.seen_key = key == pieces.seen_key, key
            if key is None or key == pieces.saved_key or not settled:
                return
            try:
                if self._snapshots.save(study_id, key, parts.ordered, parts.best, parts.rest):
                    pieces.saved_key = key
            except OSError as error:   # a full or read-only --cache-dir: the next start reads the store
                log.warning("kubetune dashboard: cannot keep study %s's page in %s: %s", study_id,
                            self._snapshots.directory, error)
                pieces.saved_key = key   # not tried again until the study changes

    def _parts(self, study_id: int, newer_than: float | None = None) -> _Parts | None:
        """Make the study's body again from the dashboard's trial list (kept for the
        dashboard's own TTL), reusing every unchanged trial's JSON.  ``newer_than``: a
        body made from a read begun after then will do: a page opening while the keeper
        (or another page) makes the body waits for that one instead of making its own
        beside it, on the same two cores (the warm-up of a dashboard just started)."""
        with self._lock:
            pieces = self._pieces.setdefault(study_id, _Pieces())
        with pieces.making:
            made = pieces.parts
            if newer_than is not None and made is not None and made.made > newer_than:
                return made
            with collection_paused() if made is None else contextlib.nullcontext():   # a first making only
                return self._make(study_id)

    def _make(self, study_id: int) -> _Parts | None:
        study = odc.get_study(self._storage, study_id)
        if study is None:   # deleted (or never was): its body goes, the next request is answered 404
            with self._lock:
                self._pieces.pop(study_id, None)
            if self._snapshots is not None:
                self._snapshots.forget(study_id)
            return None
        made = time.monotonic()
        trials = odc.get_trials(self._app_cache, self._storage, study_id)
        system_attrs = getattr(study, "system_attrs", {})
        with self._lock:
            pieces = self._pieces.setdefault(study_id, _Pieces())
        with pieces.lock:   # two pages opening a cold study at once make its pieces once
            # the study's own part (its phase may change while its trials do not)
            intersection, union, union_user_attrs, has_intermediate_values = extra_study_property(study_id, trials)
            rest = odc.serialize_study_detail(study, [], [], intersection, union, union_user_attrs,
                                              has_intermediate_values, {}, [])
            del rest["trials"], rest["best_trials"]
            rest_json = json.dumps(rest)[1:].encode()
            old = pieces.parts
            if old is not None and old.trials is trials and pieces.system_attrs == system_attrs:
                pieces.parts = _Parts(trials, old.ordered, old.best, rest_json, made)   # the same trials
                return pieces.parts
            if pieces.system_attrs != system_attrs:   # notes live there: every piece shows them
                pieces.by_id, pieces.system_attrs = {}, dict(system_attrs)
            # a new dict each time: a trial gone from the study is forgotten
            encoder = TrialEncoder(study_id, system_attrs)
            by_id = {trial_id(t): (t, self._piece(pieces.by_id, encoder, t)) for t in trials}
            # the same choice of best trials as optuna-dashboard's view (our studies are never preferential)
            if len(study.directions) > 1:
                best = odc.get_pareto_front_trials(trials=trials, directions=study.directions)
            elif any(t.state == TrialState.COMPLETE for t in trials):
                best = [self._storage.get_best_trial(study_id)]
            else:
                best = []
            pieces.by_id = by_id
            pieces.parts = _Parts(trials, [by_id[trial_id(t)][1] for t in trials],
                                  [self._piece(by_id, encoder, t) for t in best], rest_json, made)
            return pieces.parts

    @staticmethod
    def _piece(by_id: dict[int, tuple[FrozenTrial, bytes]], encoder: TrialEncoder, trial: FrozenTrial) -> bytes:
        known = by_id.get(trial_id(trial))
        if known is not None and known[0] is trial:
            return known[1]
        return encoder.encode(trial)

    def _make_all(self) -> None:
        present = [self._storage.get_study_id_from_name(s.study_name) for s in self._storage.get_all_studies()]
        with self._lock:   # Experiments deleted since (retention, kubectl delete): their bodies go
            for gone in set(self._pieces) - set(present):
                del self._pieces[gone]
        for study_id in present:   # first what a snapshot answers at once, then the store
            if self._stopped.is_set():
                return
            with self._lock:
                pieces = self._pieces.setdefault(study_id, _Pieces())
            if not pieces.looked:
                self._from_snapshot(study_id, pieces)
        with self._lock:
            if all(self._pieces[s].parts is not None for s in present if s in self._pieces):
                self.ready.set()
        for study_id in present:
            if self._stopped.is_set():
                return
            if self._parts(study_id) is not None:
                with self._lock:
                    pieces = self._pieces.get(study_id)
                if pieces is not None:
                    self._save(study_id, pieces)

    def keep(self) -> None:
        """Make every study's body now (the warm-up), then again every KEEP_SECONDS until
        ``stop``: run in a thread from the start (see the module's text)."""
        started = time.monotonic()
        try:
            self._make_all()
        except Exception:  # noqa: BLE001 - an optimisation: a request makes the body anyway
            log.exception("kubetune dashboard: warming the study pages failed")
        finally:
            self.warm_seconds = time.monotonic() - started
            self.warmed.set()
            self.ready.set()
        while not self._stopped.wait(KEEP_SECONDS):
            try:
                self._make_all()
            except Exception:  # noqa: BLE001 - the store may be away for a while: try at the next round
                log.exception("kubetune dashboard: keeping the study pages fresh failed")

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.keep, name="dashboard-keeper", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stopped.set()

