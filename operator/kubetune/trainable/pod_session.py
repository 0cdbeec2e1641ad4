"""The trial-side session inside a trial pod (``spec.executor: pod``).

The pod executor sets ``KUBETUNE_INGEST_URL`` and ``KUBETUNE_TRIAL_TOKEN`` (with
``KUBETUNE_TRIAL``, ``KUBETUNE_ATTEMPT``, ``KUBETUNE_FIRST_SEQ``,
``KUBETUNE_START_ITERATION``, ``KUBETUNE_CONFIG_FILE`` and, when resuming,
``KUBETUNE_CHECKPOINT``).  When they are there, ``kubetune.report()`` called in that
process POSTs each result to the operator::

    POST $KUBETUNE_INGEST_URL/v1/results/<namespace>/<trial>
    Authorization: Bearer $KUBETUNE_TRIAL_TOKEN
    {"seq": 7, "iteration": 3, "metrics": {...}, "checkpoint": "...", "attempt": 0, "timestamp": ...}

A network error, a 429 or a 5xx answer is retried with the same seq (the operator
records a seq once), never sooner than the operator's Retry-After and with jittered
backoff, for up to ``KUBETUNE_REPORT_TIMEOUT`` seconds (default 900); then report()
raises.  When the operator answers that the trial was stopped (or this attempt was
replaced), report() raises ``TrialStopped``.  HTTP goes through the standard library:
the trial's image needs no HTTP client package.

With ``spec.trial.metricsCollector: stdout`` (``KUBETUNE_METRICS_COLLECTOR=stdout``)
report() prints each result as a ``KUBETUNE_RESULT`` line instead (the format of
executors/pods/stdout_results.py, which the operator reads from the pod's log), so the same
training code works where the pod cannot reach the operator's ingest endpoint.
"""
from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Mapping, TextIO

from kubetune.trainable import api
from kubetune.spec.results import RESULT_PREFIX, Result, check_metrics
from kubetune.spec.trial_key import TrialKey
from kubetune.trainable.function_runner import _plain

# how long report() keeps trying one result before the trial fails: past an operator
# failover and restore (minutes), and as long as a Ray trial outlives its operator
# (--trial-lease-seconds); KUBETUNE_REPORT_TIMEOUT overrides it
DEFAULT_REPORT_TIMEOUT_S = 900.0
MAX_BACKOFF_S = 10.0
MAX_RETRY_AFTER_S = 60.0


def retry_after(value: str | None) -> float | None:
    """The seconds of a Retry-After header (delay-seconds form), capped; None if absent or not a number."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    if seconds is None or not 0 <= seconds < float("inf"):
        return None
    return min(seconds, MAX_RETRY_AFTER_S)


class ReportError(RuntimeError):
    """The operator refused a result for good (bad token, malformed result) or never answered."""


class PodSession:
    def __init__(self, environ: Mapping[str, str], output: TextIO | None = None) -> None:
        self.url = environ.get("KUBETUNE_INGEST_URL", "").rstrip("/")
        self.token = environ.get("KUBETUNE_TRIAL_TOKEN", "")
        self.trial_key = environ.get("KUBETUNE_TRIAL", "")
        # no KUBETUNE_TRIAL: not in a trial pod (the first report says so)
        namespace, _, trial = TrialKey.parse(self.trial_key) if self.trial_key else ("", "", "")
        self.endpoint = f"{self.url}/v1/results/{namespace}/{trial}"
        self.attempt = int(environ.get("KUBETUNE_ATTEMPT") or 0)
        self.start_iteration = int(environ.get("KUBETUNE_START_ITERATION") or 0)
        self._next_seq = int(environ.get("KUBETUNE_FIRST_SEQ") or 0)
        self._iteration = self.start_iteration
        self._config_file = environ.get("KUBETUNE_CONFIG_FILE", "")
        self._checkpoint = environ.get("KUBETUNE_CHECKPOINT") or None
        self._storage = environ.get("KUBETUNE_CHECKPOINT_STORAGE", "")
        self._storage_options = json.loads(environ.get("KUBETUNE_CHECKPOINT_OPTIONS") or "{}")
        self._timeout_s = float(environ.get("KUBETUNE_REPORT_TIMEOUT") or DEFAULT_REPORT_TIMEOUT_S)
        self._prints = environ.get("KUBETUNE_METRICS_COLLECTOR") == "stdout"
        self._output = output     # None: the container log, file descriptor 1
        self._restored: str | None = None
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.reports = 0          # results this process delivered

    # ---------------------------------------------------------------- api.Session

    def report(self, metrics: Mapping[str, Any], checkpoint: str | os.PathLike | None = None) -> None:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"kubetune.report() takes a dict of metrics, got {type(metrics).__name__}")
        clean = check_metrics({str(k): _plain(v, str(k)) for k, v in metrics.items()})
        with self._lock:      # one report at a time: seqs go out in order
            iteration = self._iteration + 1
            location = self._persist(checkpoint, iteration, clean) if checkpoint is not None else None
            body = Result(seq=self._next_seq, iteration=iteration, metrics=clean, timestamp=time.time(),
                          checkpoint=location, attempt=self.attempt).to_wire()
            self._send(body)
            self._next_seq += 1
            self._iteration = iteration
            self.reports += 1

    def get_config(self) -> dict:
        with open(self._config_file) as handle:
            return json.load(handle)

    def get_checkpoint(self) -> str | None:
        if self._checkpoint is None:
            return None
        if self._restored is None:
            from kubetune.checkpoints.storage import materialize
            self._restored = materialize(self._checkpoint)
        return self._restored

    def get_context(self) -> api.TrialContext:
        return api.TrialContext(trial_key=self.trial_key, attempt=self.attempt, iteration=self._iteration,
                                start_iteration=self.start_iteration, should_checkpoint=False)

    # ---------------------------------------------------------------- internals

    def _persist(self, checkpoint: str | os.PathLike, iteration: int, metrics: Mapping[str, Any]) -> str:
        """Copy a checkpoint directory to the experiment's storage (a shared path or URI);
        without storage, a location the pod names itself (already shared) is passed on."""
        if not self._storage:
            return os.fspath(checkpoint)
        from kubetune.checkpoints.storage import CheckpointStore
        options = {k: v for k, v in self._storage_options.items() if v is not None}
        return CheckpointStore(self._storage, self.trial_key, **options).persist(checkpoint, iteration, metrics)

    def _send(self, body: dict[str, Any]) -> None:
        if self._prints:
            self._print(body)
            return
        data = json.dumps(body).encode()
        deadline = time.monotonic() + self._timeout_s
        backoff, last = 0.2, ""
        while True:
            wait = None   # the operator's Retry-After, when it said
            request = urllib.request.Request(self.endpoint, data=data, method="POST", headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    response.read()
                    return
            except urllib.error.HTTPError as error:
                text = error.read().decode(errors="replace")
                if error.code in (409, 410):
                    raise api.TrialStopped() from None
                if error.code < 500 and error.code != 429:
                    raise ReportError(f"the operator refused result seq {body['seq']}: "
                                      f"HTTP {error.code}: {text}") from None
                last = f"HTTP {error.code}: {text}"
                wait = retry_after(error.headers.get("Retry-After") if error.headers else None)
            except OSError as error:     # connection refused/reset, timeout, DNS
                last = f"{type(error).__name__}: {error}"
            # full jitter: the pods of an Experiment that lost the operator together do not
            # come back in step; never sooner than the operator asked
            delay = max(wait or 0.0, random.uniform(0.5 * backoff, backoff))
            if time.monotonic() + delay > deadline:
                raise ReportError(f"could not deliver result seq {body['seq']} to {self.endpoint} "
                                  f"within {self._timeout_s:.0f}s; last error: {last}")
            time.sleep(delay)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


    def _print(self, body: dict[str, Any]) -> None:
        """One result line; its seq is its position among the attempt's result lines,
        which is the order this session numbers them in."""
        line = {**body["metrics"], "iteration": body["iteration"]}
        if body["checkpoint"] is not None:
            line["checkpoint"] = body["checkpoint"]
        # the container log is file descriptor 1, whatever the program made of sys.stdout
        output = self._output or sys.__stdout__ or sys.stdout
        print(f"{RESULT_PREFIX} {json.dumps(line)}", file=output, flush=True)


_session: PodSession | None = None
_session_lock = threading.Lock()


def pod_session(environ: Mapping[str, str] = os.environ) -> PodSession | None:
    """The process-wide session of a trial pod, or None when not running in one."""
    global _session
    prints = environ.get("KUBETUNE_METRICS_COLLECTOR") == "stdout" and environ.get("KUBETUNE_TRIAL")
    if not (prints or (environ.get("KUBETUNE_INGEST_URL") and environ.get("KUBETUNE_TRIAL_TOKEN"))):
        return None      # a process printing its results (executors/local) needs no endpoint
    with _session_lock:
        if _session is None:
            _session = PodSession(environ)
        return _session
