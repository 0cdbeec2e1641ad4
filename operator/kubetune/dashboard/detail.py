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
(``dashboard_compat``), and the body equals what its own view answers
(tests/integration/test_dashboard_storage.py checks it), so the page keeps working.

``warm`` makes every study's pieces in the background when the dashboard starts, so the
first opening of a big Experiment does not pay for them."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from kubetune.dashboard import dashboard_compat as odc

log = logging.getLogger(__name__)


@dataclass
class _Pieces:
    lock: threading.Lock = field(default_factory=threading.Lock)
    system_attrs: dict[str, Any] | None = None                    # the study's, when the pieces were made
    by_id: dict[int, tuple[FrozenTrial, bytes]] = field(default_factory=dict)   # trial ID -> (trial, its JSON)


class StudyDetails:
    """``storage``: the dashboard's storage; ``app_cache``: the dashboard app's own
    cache (its trial list and search spaces), shared with its other views."""

    def __init__(self, storage, app_cache) -> None:
        self._storage = storage
        self._app_cache = app_cache
        self._lock = threading.Lock()
        self._pieces: dict[int, _Pieces] = {}
        self.warmed = threading.Event()
        self.warm_seconds: float | None = None

    def body(self, study_id: int, after: int = 0) -> bytes | None:
        """The response body, or None when there is no such study."""
        parts = self._parts(study_id)
        if parts is None:
            return None
        ordered, best, rest = parts
        return b"".join([b'{"trials":[', b",".join(ordered[after:]), b'],"best_trials":[', b",".join(best),
                         b"],", json.dumps(rest)[1:].encode()])

    def _parts(self, study_id: int) -> tuple[list[bytes], list[bytes], dict[str, Any]] | None:
        """Every trial's JSON, the best trials' JSON, and the rest of the body."""
        study = odc.get_study(self._storage, study_id)
        if study is None:
            return None
        trials = odc.get_trials(self._app_cache, self._storage, study_id)
        system_attrs = getattr(study, "system_attrs", {})
        by_id = self._pieces_of(study_id, trials, system_attrs)
        # the same choice of best trials as optuna-dashboard's view (our studies are never preferential)
        if len(study.directions) > 1:
            best = odc.get_pareto_front_trials(trials=trials, directions=study.directions)
        elif any(t.state == TrialState.COMPLETE for t in trials):
            best = [self._storage.get_best_trial(study_id)]
        else:
            best = []
        intersection, union, union_user_attrs, has_intermediate_values = \
            odc.get_cached_extra_study_property(self._app_cache, study_id, trials)
        rest = odc.serialize_study_detail(study, [], [], intersection, union, union_user_attrs,
                                          has_intermediate_values, {}, [])
        del rest["trials"], rest["best_trials"]
        return ([by_id[t._trial_id][1] for t in trials],
                [self._piece(by_id, study_id, t, system_attrs) for t in best], rest)

    def _pieces_of(self, study_id: int, trials: list[FrozenTrial],
                   system_attrs: dict[str, Any]) -> dict[int, tuple[FrozenTrial, bytes]]:
        """Trial ID -> (trial, its JSON) for these trials, made only for trials not seen before."""
        with self._lock:
            pieces = self._pieces.setdefault(study_id, _Pieces())
        with pieces.lock:   # two pages opening a cold study at once make its pieces once
            if pieces.system_attrs != system_attrs:   # notes live there: every piece shows them
                pieces.by_id, pieces.system_attrs = {}, dict(system_attrs)
            # a new dict each time (a trial gone from the study is forgotten); readers keep theirs
            pieces.by_id = {t._trial_id: (t, self._piece(pieces.by_id, study_id, t, system_attrs)) for t in trials}
            return pieces.by_id

    @staticmethod
    def _piece(by_id: dict[int, tuple[FrozenTrial, bytes]], study_id: int, trial: FrozenTrial,
               system_attrs: dict[str, Any]) -> bytes:
        known = by_id.get(trial._trial_id)
        if known is not None and known[0] is trial:
            return known[1]
        # json.dumps as Bottle's own JSON plugin does, so the bytes are the dashboard's own
        return json.dumps(odc.serialize_frozen_trial(study_id, trial, system_attrs)).encode()

    def warm(self) -> None:
        """Make every study's pieces (run in a thread at start: see the module's text)."""
        started = time.monotonic()
        try:
            for study in self._storage.get_all_studies():
                self._parts(study._study_id)
        except Exception:  # noqa: BLE001 - warming is an optimisation: a request makes the pieces anyway
            log.exception("kubetune dashboard: warming the study pages failed")
        finally:
            self.warm_seconds = time.monotonic() - started
            self.warmed.set()

    def start_warming(self) -> threading.Thread:
        thread = threading.Thread(target=self.warm, name="dashboard-warm", daemon=True)
        thread.start()
        return thread

