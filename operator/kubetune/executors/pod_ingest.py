"""Metrics by push: trial pods POST their results to the operator.

    POST /v1/results/<namespace>/<trial>
    Authorization: Bearer <the trial's token, from its Secret <trial>-token>
    {"seq": 0, "iteration": 1, "metrics": {"loss": 0.3}, "checkpoint": "s3://...",   # optional
     "attempt": 0, "timestamp": 1700000000.0}                                         # optional

Answers: 200 ``{"accepted": true}`` (``false`` with ``"duplicate": true`` for a seq
already received: a retry after a lost answer is not counted twice); 400 for a
malformed body; 403 when the token is not that trial's (nothing is recorded); 409
``{"stop": true}`` for a result of an attempt that was replaced; 410 ``{"stop":
true}`` once the trial was told to stop.

``ResultInbox`` buffers what arrived, by trial and seq, until the pod executor's
``poll`` hands it to the controller (which records each seq once).  The buffer
lives in the operator's memory: results accepted but not yet written to the Trial
are lost if the operator dies in between (at most a few seconds of reports).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from kubetune.core.types import Result

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
MAX_BUFFERED_PER_TRIAL = 10_000

# (namespace, trial) -> (experiment, token), or None if that trial has no token
TokenLookup = Callable[[str, str], Awaitable[tuple[str, str] | None]]


@dataclass
class _Box:
    experiment: str
    token: str
    attempt: int | None = None
    results: dict[int, Result] = field(default_factory=dict)
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
        namespace, experiment, trial = trial_key.split("/")
        with self._lock:
            self._boxes[(namespace, trial)] = _Box(experiment, token, attempt, taken=after_seq)

    def adopt(self, namespace: str, trial: str, experiment: str, token: str) -> _Box:
        """A trial this process did not start (the operator restarted): accept its results."""
        with self._lock:
            return self._boxes.setdefault((namespace, trial), _Box(experiment, token))

    def token(self, namespace: str, trial: str) -> str | None:
        with self._lock:
            box = self._boxes.get((namespace, trial))
            return box.token if box else None

    def offer(self, namespace: str, trial: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Buffer one validated result of an authenticated trial; (HTTP status, answer)."""
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
            if len(box.results) >= MAX_BUFFERED_PER_TRIAL:
                return 429, {"error": "too many results waiting; retry later"}
            box.results[seq] = Result(seq=seq, iteration=body["iteration"], metrics=body["metrics"],
                                      timestamp=body.get("timestamp") or time.time(),
                                      checkpoint=body.get("checkpoint"), attempt=attempt)
            if body.get("checkpoint"):
                box.checkpoint = body["checkpoint"]
            box.iteration = body["iteration"]
        return 200, {"accepted": True}

    def take(self, trial_key: str, after_seq: int, limit: int = 1000) -> tuple[Result, ...]:
        """Results with seq > ``after_seq`` in order; older ones are dropped."""
        namespace, _, trial = trial_key.split("/")
        with self._lock:
            box = self._boxes.get((namespace, trial))
            if box is None:
                return ()
            for seq in [s for s in box.results if s <= after_seq]:
                del box.results[seq]
            box.taken = max(box.taken, after_seq)
            return tuple(box.results[s] for s in sorted(box.results)[:limit])

    def latest(self, trial_key: str) -> tuple[str | None, int | None]:
        """(checkpoint, iteration) last reported by the current attempt."""
        namespace, _, trial = trial_key.split("/")
        with self._lock:
            box = self._boxes.get((namespace, trial))
            return (box.checkpoint, box.iteration) if box else (None, None)

    def stop(self, trial_key: str) -> None:
        """Refuse further results: the trial's pod is told to stop at its next report."""
        namespace, _, trial = trial_key.split("/")
        with self._lock:
            box = self._boxes.get((namespace, trial))
            if box is not None:
                box.stopped = True
                box.results.clear()

    def forget(self, prefix: str) -> None:
        """Drop every trial under ``"<namespace>/<experiment>/"`` (the Experiment is gone)."""
        namespace, experiment = prefix.split("/")[:2]
        with self._lock:
            for key in [k for k, box in self._boxes.items()
                        if k[0] == namespace and box.experiment == experiment]:
                del self._boxes[key]


def _validate(body: Any) -> str:
    """Why ``body`` is not a result, or ""."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("seq"), int) or isinstance(body.get("seq"), bool) or body["seq"] < 0:
        return "seq: required, an integer >= 0"
    if not isinstance(body.get("iteration"), int) or isinstance(body.get("iteration"), bool) \
            or body["iteration"] < 1:
        return "iteration: required, an integer >= 1"
    if not isinstance(body.get("metrics"), dict):
        return "metrics: required, an object"
    if body.get("checkpoint") is not None and not isinstance(body["checkpoint"], str):
        return "checkpoint: a string (a location) when given"
    if body.get("attempt") is not None and (not isinstance(body["attempt"], int) or body["attempt"] < 0):
        return "attempt: an integer >= 0 when given"
    if body.get("timestamp") is not None and not isinstance(body["timestamp"], (int, float)):
        return "timestamp: a number (seconds since the epoch) when given"
    return ""


class IngestServer:
    """The HTTP endpoint trial pods report to (aiohttp, in the operator's event loop)."""

    def __init__(self, inbox: ResultInbox, lookup: TokenLookup, *, host: str = "0.0.0.0", port: int = 8081):
        self.inbox = inbox
        self._lookup = lookup
        self.host = host
        self.port = port
        self._runner = None

    async def start(self) -> None:
        from aiohttp import web
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/v1/results/{namespace}/{trial}", self._post_result)
        app.router.add_get("/healthz", self._healthz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.port == 0:   # an ephemeral port: say which one
            self.port = site._server.sockets[0].getsockname()[1]
        log.info("result ingest listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _healthz(self, request):
        from aiohttp import web
        return web.Response(text="ok")

    async def _post_result(self, request):
        from aiohttp import web
        namespace, trial = request.match_info["namespace"], request.match_info["trial"]
        if not await self._authorized(namespace, trial, request.headers.get("Authorization", "")):
            return web.json_response({"error": f"not authorized to report for {namespace}/{trial}"}, status=403)
        try:
            body = json.loads(await request.read())
        except ValueError as error:
            return web.json_response({"error": f"the body is not JSON: {error}"}, status=400)
        problem = _validate(body)
        if problem:
            return web.json_response({"error": problem}, status=400)
        status, answer = self.inbox.offer(namespace, trial, body)
        return web.json_response(answer, status=status)

    async def _authorized(self, namespace: str, trial: str, header: str) -> bool:
        scheme, _, offered = header.partition(" ")
        if scheme.lower() != "bearer" or not offered.strip():
            return False
        expected = self.inbox.token(namespace, trial)
        if expected is None:      # a trial started before this operator process: ask its Secret
            try:
                found = await self._lookup(namespace, trial)
            except Exception:  # noqa: BLE001 - cannot check the token: refuse, the client retries
                log.exception("looking up the token of %s/%s", namespace, trial)
                return False
            if found is None:
                return False
            experiment, expected = found
            expected = self.inbox.adopt(namespace, trial, experiment, expected).token
        return hmac.compare_digest(offered.strip().encode(), expected.encode())


def secret_token_lookup(core_api_factory: Callable[[], Any]) -> TokenLookup:
    """Look a trial's token up in its Secret (``<trial>-token``, labelled with its experiment)."""
    from kubernetes.client.exceptions import ApiException

    from kubetune.executors.pod_spec import LABEL_EXPERIMENT, TOKEN_KEY, secret_name

    def read(namespace: str, trial: str) -> tuple[str, str] | None:
        import base64
        try:
            secret = core_api_factory().read_namespaced_secret(secret_name(trial), namespace)
        except ApiException as error:
            if error.status in (403, 404):
                return None
            raise
        labels = secret.metadata.labels or {}
        data = secret.data or {}
        owned = any(ref.kind == "Trial" and ref.name == trial for ref in secret.metadata.owner_references or [])
        if not owned or LABEL_EXPERIMENT not in labels or TOKEN_KEY not in data:
            return None
        return labels[LABEL_EXPERIMENT], base64.b64decode(data[TOKEN_KEY]).decode()

    async def lookup(namespace: str, trial: str) -> tuple[str, str] | None:
        return await asyncio.to_thread(read, namespace, trial)

    return lookup
