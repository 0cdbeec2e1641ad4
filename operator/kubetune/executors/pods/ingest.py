"""Metrics by push: trial pods POST their results to the operator.

    POST /v1/results/<namespace>/<trial>
    Authorization: Bearer <the trial's token, from its Secret <trial>-token>
    {"seq": 0, "iteration": 1, "metrics": {"loss": 0.3}, "checkpoint": "s3://...",   # optional
     "attempt": 0, "timestamp": 1700000000.0}                                         # optional

Answers: 200 ``{"accepted": true}`` (``false`` with ``"duplicate": true`` for a seq
already received: a retry after a lost answer is not counted twice); 400 for a
malformed body or a seq/iteration out of bounds; 403 when the token is not that
trial's (nothing is recorded, the body is not even read); 503 with ``Retry-After``
for a trial this operator process does not know (yet: after a restart it learns a
running trial's token at its first poll); 409 ``{"stop": true}`` for a result of an
attempt that was replaced; 410 ``{"stop": true}`` once the trial was told to stop;
429 with ``Retry-After`` when the trial's buffer is full.

The endpoint runs only when the operator's pod executor is on (``--pod-executor``),
on an event loop of its own in its own thread (ingest_http.py), and costs no
Kubernetes API call and no worker thread: a token is checked against the
SHA-256 the inbox holds for that one trial (constant-time compare), learnt when the
executor created the trial's Secret or, after a restart, read once by the executor's
poll.  A flood of bogus POSTs therefore costs the ingest loop a dictionary lookup
each, not the thread pool or the event loop every controller shares.  Limits (ingest_http.py for the
connection-level ones): headers within 5 s, a body of at most ``MAX_BODY_BYTES``
within 10 s, 256 connections at once, per trial ``MAX_BUFFERED_PER_TRIAL`` results
or ``MAX_BUFFERED_BYTES_PER_TRIAL`` bytes waiting for the controller, ``seq`` and
``iteration`` below ``MAX_SEQ``, a checkpoint location of ``MAX_CHECKPOINT_CHARS``.

``ResultInbox`` buffers what arrived, by trial and seq, until the pod executor's
``poll`` hands it to the controller (which records each seq once).  The buffer
lives in the operator's memory: results accepted but not yet written to the Trial
are lost if the operator dies in between (at most a few seconds of reports).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from kubetune.executors.pods.ingest_http import BoundedHttpServer, HttpError
from kubetune.spec.trial_key import ExperimentKey, TrialKey
from kubetune.spec.results import MAX_RESULT_BYTES, MetricError, Result, check_iteration, check_metrics

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_RESULT_BYTES     # a body is one result
MAX_BUFFERED_PER_TRIAL = 1_000
MAX_BUFFERED_BYTES_PER_TRIAL = 8 << 20
MAX_SEQ = 2 ** 31 - 1           # seq and iteration: what a 32-bit counter holds, far beyond any run
MAX_CHECKPOINT_CHARS = 4096
RETRY_AFTER_S = 2
_PATH = re.compile(r"^/v1/results/([a-z0-9][a-z0-9.-]{0,252})/([a-z0-9][a-z0-9.-]{0,252})$")


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass
class _Box:
    experiment: str
    token_hash: bytes | None          # None: no token accepted (a stdout trial adopted after a restart)
    attempt: int | None = None
    results: dict[int, Result] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)     # seq -> bytes its body took
    taken: int = -1                  # highest seq the controller has seen
    stopped: bool = False
    checkpoint: str | None = None    # latest checkpoint reported by the current attempt
    iteration: int | None = None


class ResultInbox:
    """Thread-safe: the ingest server (event loop) adds, the executor (a thread) takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._boxes: dict[tuple[str, str], _Box] = {}

    def open(self, trial_key: str, token: str, attempt: int, after_seq: int) -> None:
        """A new attempt starts: it reports seqs after ``after_seq``; older attempts are refused."""
        namespace, experiment, trial = TrialKey.parse(trial_key)
        with self._lock:
            self._boxes[(namespace, trial)] = _Box(experiment, token_hash(token), attempt, taken=after_seq)

    def adopt(self, namespace: str, trial: str, experiment: str, token: str, after_seq: int = -1) -> _Box:
        """A trial this process did not start (the operator restarted): accept its results
        (with ``token``; "" accepts none by HTTP, e.g. a stdout trial read from its log)
        after ``after_seq``, the last one the controller recorded: a log read again from its
        first line does not fill the box with results stored already."""
        with self._lock:
            box = self._boxes.setdefault((namespace, trial), _Box(experiment, None, taken=after_seq))
            if token and box.token_hash is None:
                box.token_hash = token_hash(token)
            return box

    def token(self, namespace: str, trial: str) -> str | None:
        """The SHA-256 (hex) of the trial's token, "" when it accepts none, None when unknown."""
        with self._lock:
            box = self._boxes.get((namespace, trial))
            if box is None:
                return None
            return box.token_hash.hex() if box.token_hash else ""

    def authorize(self, namespace: str, trial: str, offered: str) -> bool | None:
        """Whether ``offered`` is this trial's token; None when the trial is unknown here."""
        with self._lock:
            box = self._boxes.get((namespace, trial))
            expected = box.token_hash if box else None
        if box is None:
            return None
        # compare digests: constant time, and the same length whatever was offered
        return expected is not None and hmac.compare_digest(token_hash(offered), expected)

    def offer(self, namespace: str, trial: str, body: dict[str, Any],
              size: int | None = None) -> tuple[int, dict[str, Any]]:
        """Buffer one validated result of an authenticated trial; (HTTP status, answer)."""
        problem = _bounds(body)
        if problem:
            return 400, {"error": problem}
        size = size if size is not None else len(json.dumps(body, default=str))
        with self._lock:
            box = self._boxes.get((namespace, trial))
            if box is None:
                return 404, {"error": f"trial {namespace}/{trial} is not running"}
            if box.stopped:
                return 410, {"stop": True, "error": "the trial was stopped"}
            attempt = body.get("attempt")
            if box.attempt is None:
                box.attempt = attempt
            elif attempt is not None and attempt != box.attempt:
                return 409, {"stop": True, "error": f"attempt {attempt} was replaced by attempt {box.attempt}"}
            seq = body["seq"]
            if seq <= box.taken or seq in box.results:
                return 200, {"accepted": False, "duplicate": True}
            if len(box.results) >= MAX_BUFFERED_PER_TRIAL \
                    or sum(box.sizes.values()) + size > MAX_BUFFERED_BYTES_PER_TRIAL:
                return 429, {"error": "too many results waiting for the operator; retry later",
                             "retryAfterSeconds": RETRY_AFTER_S}
            box.results[seq] = Result.from_wire(body, now=time.time())
            box.sizes[seq] = size
            if body.get("checkpoint"):
                box.checkpoint = body["checkpoint"]
            box.iteration = body["iteration"]
        return 200, {"accepted": True}

    def take(self, trial_key: str, after_seq: int, limit: int = 1000) -> tuple[Result, ...]:
        """Results with seq > ``after_seq`` in order; older ones are dropped."""
        namespace, _, trial = TrialKey.parse(trial_key)
        with self._lock:
            box = self._boxes.get((namespace, trial))
            if box is None:
                return ()
            for seq in [s for s in box.results if s <= after_seq]:
                del box.results[seq]
                box.sizes.pop(seq, None)
            box.taken = max(box.taken, after_seq)
            return tuple(box.results[s] for s in sorted(box.results)[:limit])

    def latest(self, trial_key: str) -> tuple[str | None, int | None]:
        """(checkpoint, iteration) last reported by the current attempt."""
        namespace, _, trial = TrialKey.parse(trial_key)
        with self._lock:
            box = self._boxes.get((namespace, trial))
            return (box.checkpoint, box.iteration) if box else (None, None)

    def stop(self, trial_key: str) -> None:
        """Refuse further results: the trial's pod is told to stop at its next report."""
        namespace, _, trial = TrialKey.parse(trial_key)
        with self._lock:
            box = self._boxes.get((namespace, trial))
            if box is not None:
                box.stopped = True
                box.results.clear()
                box.sizes.clear()

    def forget(self, prefix: str) -> None:
        """Drop every trial under ``"<namespace>/<experiment>/"`` (the Experiment is gone)."""
        namespace, experiment = ExperimentKey.parse(prefix)
        with self._lock:
            for key in [k for k, box in self._boxes.items()
                        if k[0] == namespace and box.experiment == experiment]:
                del self._boxes[key]


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounds(body: Mapping[str, Any]) -> str:
    """Why a result's counters or location are out of bounds, or "" (both ingest paths)."""
    if body["seq"] > MAX_SEQ:
        return f"seq: at most {MAX_SEQ}"
    if body["iteration"] > MAX_SEQ:
        return f"iteration: at most {MAX_SEQ}"
    if isinstance(body.get("checkpoint"), str) and len(body["checkpoint"]) > MAX_CHECKPOINT_CHARS:
        return f"checkpoint: a location of at most {MAX_CHECKPOINT_CHARS} characters"
    return ""


def _validate(body: Any) -> str:
    """Why ``body`` is not a result, or ""."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not _count(body.get("seq")) or not 0 <= body["seq"] <= MAX_SEQ:
        return f"seq: required, an integer from 0 to {MAX_SEQ}"
    if not _count(body.get("iteration")) or not 1 <= body["iteration"] <= MAX_SEQ:
        return f"iteration: required, an integer from 1 to {MAX_SEQ}"
    if not isinstance(body.get("metrics"), dict):
        return "metrics: required, an object"
    try:   # the checks every collector makes (NaN and Infinity are fine)
        check_iteration(body.get("iteration"))
        check_metrics(body["metrics"])
    except MetricError as error:
        return str(error)
    if body.get("checkpoint") is not None and not isinstance(body["checkpoint"], str):
        return "checkpoint: a string (a location) when given"
    if body.get("attempt") is not None and (not _count(body["attempt"]) or not 0 <= body["attempt"] <= MAX_SEQ):
        return f"attempt: an integer from 0 to {MAX_SEQ} when given"
    if body.get("timestamp") is not None and (not isinstance(body["timestamp"], (int, float))
                                              or isinstance(body["timestamp"], bool)
                                              or not math.isfinite(body["timestamp"])):
        return "timestamp: a number (seconds since the epoch) when given"
    return _bounds(body)


class IngestServer:
    """The HTTP endpoint trial pods report to, in the operator's event loop."""

    def __init__(self, inbox: ResultInbox, *, host: str = "0.0.0.0", port: int = 8081, **limits: float) -> None:
        self.inbox = inbox
        self._http = BoundedHttpServer(self._handle, host=host, port=port, max_body_bytes=MAX_BODY_BYTES,
                                       **limits)

    @property
    def host(self) -> str:
        return self._http.host

    @property
    def port(self) -> int:
        return self._http.port

    async def start(self) -> None:
        await self._http.start()
        log.info("result ingest listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        await self._http.stop()

    async def _handle(self, method: str, path: str, headers: Mapping[str, str],
                      read_body: Callable[[], Awaitable[bytes]]) -> tuple[int, Any, Mapping[str, str]]:
        if path == "/healthz":
            return 200, "ok", {}
        match = _PATH.match(path)
        if match is None:
            return 404, {"error": "POST /v1/results/<namespace>/<trial>"}, {}
        if method != "POST":
            return 405, {"error": "POST only"}, {}
        namespace, trial = match.groups()
        scheme, _, offered = headers.get("authorization", "").partition(" ")
        allowed = self.inbox.authorize(namespace, trial, offered.strip()) \
            if scheme.lower() == "bearer" and offered.strip() else False
        if allowed is None:
            return 503, {"error": f"trial {namespace}/{trial} is not known to this operator (yet); retry"}, \
                {"Retry-After": str(RETRY_AFTER_S)}
        if not allowed:
            return 403, {"error": f"not authorized to report for {namespace}/{trial}"}, {}
        raw = await read_body()
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise HttpError(400, f"the body is not JSON: {error}") from None
        problem = _validate(body)
        if problem:
            return 400, {"error": problem}, {}
        status, answer = self.inbox.offer(namespace, trial, body, size=len(raw))
        return status, answer, ({"Retry-After": str(RETRY_AFTER_S)} if status == 429 else {})
