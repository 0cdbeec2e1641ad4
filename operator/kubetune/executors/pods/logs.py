"""Results from a trial pod's log (``spec.trial.metricsCollector: stdout``).

The pod executor calls ``PodLogFollower.track`` for each such pod at every poll:

- Running: one thread per pod follows the first container's log through the API
  server (``pods/log`` with ``follow=true``) and offers each result line to the
  same ``ResultInbox`` the HTTP push ingest fills;
- Succeeded or Failed: the stream is closed and the whole log is read once more
  (a plain, non-following read), so the lines printed just before the container
  exited are delivered before the pod executor reports the trial ended;
- Pending: nothing yet (the scheduler may keep it there for long).

Why a follow stream, not polling with ``sinceTime``: the API server passes
``sinceTime`` to the kubelet in whole seconds, so polling re-reads or skips lines
printed in the same second and would need timestamps to tell them apart; a stream
delivers each line once, as it is printed, from one open request per running pod.
A stream that ends while the pod runs (the kubelet dropped it) is opened again by
the next poll, at most every ``retry_s``, and reads from the first line: results
are numbered by their position in the log (stdout_results.py), so what was
already offered is dropped by the inbox's seq dedupe — as after an operator
restart, when the new process starts from the first line too.

Known limit: the kubelet serves the current log file only; once it rotates the log
(``containerLogMaxSize``, 10Mi by default) a stream opened afterwards cannot count
the lines before, and numbers later results as old ones.  Programs that print that
much should report by push.
"""
from __future__ import annotations

import datetime
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from kubetune.executors.pods import spec as pod_spec
from kubetune.executors.pods.ingest import ResultInbox
from kubetune.executors.pods.stdout_results import LogLines, MalformedLine, ResultLine, ResultLines
from kubetune.k8s.errors import ApiError
from kubetune.k8s.pods import PodApi
from kubetune.spec.trial_key import TrialKey

log = logging.getLogger(__name__)

MAX_WARNINGS_PER_POD = 5
FINAL_READ_TRIES = 3
CHUNK_BYTES = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
# A followed stream quiet this long is reopened (and the log re-read): a connection that
# died without a word would otherwise hold its thread, and the pod's results, for ever.
STREAM_IDLE_TIMEOUT_S = 300.0
FINAL_READ_TIMEOUT_S = 60.0


def collects_stdout(pod: Mapping[str, Any]) -> bool:
    annotations = pod["metadata"].get("annotations") or {}
    return annotations.get(pod_spec.ANNOTATION_METRICS_COLLECTOR) == "stdout"


def result_lines(pod: Mapping[str, Any]) -> ResultLines:
    """The parser for one pod's log, numbered as the pod was told when it was created
    (its env), not as the operator would launch it now: a restart must not renumber."""
    env = {item.get("name"): item.get("value") for item in pod["spec"]["containers"][0].get("env") or []}
    attempt = (pod["metadata"].get("labels") or {}).get(pod_spec.LABEL_ATTEMPT)
    return ResultLines(first_seq=int(env.get("KUBETUNE_FIRST_SEQ") or 0),
                       start_iteration=int(env.get("KUBETUNE_START_ITERATION") or 0),
                       attempt=int(attempt) if attempt is not None else None)


@dataclass
class _Stream:
    pod: str
    started: float
    thread: threading.Thread | None = None
    response: Any = None
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        """Unblock the reading thread (a socket shutdown) and tell it to end."""
        with self.lock:
            self.closed = True
            response = self.response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # noqa: BLE001 - already closed
                pass

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


class PodLogFollower:
    """Thread-safe; every method returns without waiting on a running pod's output."""

    def __init__(self, inbox: ResultInbox, api: PodApi, *, retry_s: float = 2.0) -> None:
        self.inbox = inbox
        self._api = api
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}        # trial key -> the stream of its current pod
        self._drained: set[tuple[str, str]] = set()     # (trial key, pod uid): ended pods read to the end
        self._warned: dict[tuple[str, str], set[int]] = {}   # (trial key, pod uid) -> malformed seqs reported

    def track(self, trial_key: str, pod: Mapping[str, Any], after_seq: int = -1) -> bool:
        """Follow the running pod; read an ended one to its last line (this call waits for
        that).  False while an ended pod's log is not read to its end yet (its results did not
        all fit in the inbox: read on once the controller took them): the trial has not ended
        for the controller until it is.  ``after_seq``: the last result the controller
        recorded, where a trial adopted after a restart starts."""
        namespace, experiment, trial = TrialKey.parse(trial_key)
        if self.inbox.token(namespace, trial) is None:
            # started by an earlier operator process: its results come from the log only, so
            # no token is needed (and none accepted: "" matches no bearer token)
            self.inbox.adopt(namespace, trial, experiment, "", after_seq=after_seq)
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return self._drain(trial_key, pod)
        if phase == "Running":
            self._follow(trial_key, pod)
        return True

    def forget(self, trial_key: str) -> None:
        """The trial was stopped: close its stream."""
        with self._lock:
            stream = self._streams.pop(trial_key, None)
        if stream is not None:
            stream.close()

    def forget_prefix(self, prefix: str) -> None:
        """The experiment is gone: close its streams, drop what was kept of its pods."""
        with self._lock:
            keys = [key for key in self._streams if key.startswith(prefix)]
            self._drained = {item for item in self._drained if not item[0].startswith(prefix)}
            self._warned = {item: seqs for item, seqs in self._warned.items() if not item[0].startswith(prefix)}
        for key in keys:
            self.forget(key)

    # ---------------------------------------------------------------- following

    def _follow(self, trial_key: str, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self._lock:
            stream = self._streams.get(trial_key)
            if stream is not None and stream.pod == name and \
                    (stream.alive() or time.monotonic() - stream.started < self.retry_s):
                return
            replaced = stream if stream is not None and stream.pod != name else None
            stream = self._streams[trial_key] = _Stream(name, time.monotonic())
            stream.thread = threading.Thread(target=self._read_stream, args=(trial_key, pod, stream),
                                             name=f"kubetune-log-{name}", daemon=True)
        if replaced is not None:
            replaced.close()
        stream.thread.start()

    def _read_stream(self, trial_key: str, pod: Mapping[str, Any], stream: _Stream) -> None:
        meta = pod["metadata"]
        try:
            response = self._api.open_pod_log(meta["namespace"], meta["name"], pod["spec"]["containers"][0]["name"],
                                              follow=True, timeout=(CONNECT_TIMEOUT_S, STREAM_IDLE_TIMEOUT_S))
        except ApiError as error:   # e.g. 400 while the container starts: the next poll retries
            log.debug("cannot follow the log of pod %s/%s: %s", meta["namespace"], meta["name"], error)
            return
        except Exception as error:  # noqa: BLE001 - the API server is unreachable: the next poll retries
            log.warning("cannot follow the log of pod %s/%s: %s", meta["namespace"], meta["name"], error)
            return
        with stream.lock:
            stream.response = response
            closed = stream.closed
        parser, lines = result_lines(pod), LogLines()
        try:
            if closed:
                return
            for chunk in response.stream(CHUNK_BYTES):
                for line, overlong in lines.feed(chunk):
                    if self._deliver(trial_key, pod, parser.feed(line, overlong)):
                        return
                if stream.closed:
                    return
        except Exception as error:  # noqa: BLE001 - closed by us, or dropped: the next poll reopens it
            if not stream.closed:
                log.debug("the log stream of pod %s/%s ended: %s", meta["namespace"], meta["name"], error)
        finally:
            response.release_conn()

    # ---------------------------------------------------------------- the last lines

    def _drain(self, trial_key: str, pod: Mapping[str, Any]) -> bool:
        """Whether the ended pod's log is read to its end (or could not be read at all,
        which is reported): its last result is then in the inbox."""
        meta = pod["metadata"]
        with self._lock:
            if (trial_key, meta["uid"]) in self._drained:
                return True
            stream = self._streams.get(trial_key)
            if stream is not None and stream.pod == meta["name"]:
                del self._streams[trial_key]
            else:
                stream = None
        if stream is not None:
            stream.close()
            if stream.thread is not None:
                stream.thread.join(timeout=5.0)
        refused, error = None, None
        for attempt in range(FINAL_READ_TRIES):
            try:
                refused = self._read_to_end(trial_key, pod)
                break
            except Exception as caught:  # noqa: BLE001 - the kubelet may be briefly unreachable
                error = caught     # read again from the first line: the inbox drops what it has
                time.sleep(0.5 * (attempt + 1))
        if refused == 429:    # a full buffer: read on (from the start, deduplicated) once it was taken
            return False
        with self._lock:
            self._drained.add((trial_key, meta["uid"]))
        if refused is None:
            log.warning("cannot read the log of ended pod %s/%s: %s", meta["namespace"], meta["name"], error)
            self._warn(pod, "ResultsIncomplete",
                       f"{meta['name']}: the log could not be read after the container ended ({error}); "
                       "results printed since the last one recorded are missing", name_suffix="final")
        return True

    def _read_to_end(self, trial_key: str, pod: Mapping[str, Any]) -> int:
        """Deliver every line of an ended pod's log, streamed (not held whole); the refusal
        status that stopped it, or 0."""
        meta = pod["metadata"]
        response = self._api.open_pod_log(meta["namespace"], meta["name"], pod["spec"]["containers"][0]["name"],
                                          follow=False, timeout=(CONNECT_TIMEOUT_S, FINAL_READ_TIMEOUT_S))
        parser, lines = result_lines(pod), LogLines()
        try:
            for chunk in response.stream(CHUNK_BYTES):
                for line, overlong in lines.feed(chunk):
                    if refused := self._deliver(trial_key, pod, parser.feed(line, overlong)):
                        return refused
            for line, overlong in lines.finish():   # the last line may lack its newline
                if refused := self._deliver(trial_key, pod, parser.feed(line, overlong)):
                    return refused
            return 0
        finally:
            response.release_conn()

    # ---------------------------------------------------------------- delivery

    def _deliver(self, trial_key: str, pod: Mapping[str, Any], item: ResultLine | MalformedLine | None) -> int:
        """Hand one parsed line on; the refusal's status when the trial takes no more results
        now (404, 409, 410: stopped or replaced; 429: a full buffer), else 0."""
        if item is None:
            return 0
        if isinstance(item, MalformedLine):
            self._report_malformed(trial_key, pod, item)
            return 0
        namespace, _, trial = TrialKey.parse(trial_key)
        status, answer = self.inbox.offer(namespace, trial, item.body)
        if status == 400:    # out of the ingest's bounds: said, as a malformed line is
            self._report_malformed(trial_key, pod, MalformedLine(item.seq, str(answer.get("error")), ""))
            return 0
        if status in (404, 409, 410, 429):   # 429: the stream reopens (and re-reads) once taken
            log.info("%s: result seq %d from the log not taken: %s", trial_key, item.seq, answer.get("error"))
            return status
        return 0

    def _report_malformed(self, trial_key: str, pod: Mapping[str, Any], item: MalformedLine) -> None:
        with self._lock:
            seen = self._warned.setdefault((trial_key, pod["metadata"]["uid"]), set())
            if item.seq in seen or len(seen) >= MAX_WARNINGS_PER_POD:
                return
            seen.add(item.seq)
            last = len(seen) == MAX_WARNINGS_PER_POD
        message = f"{pod['metadata']['name']}: result line (seq {item.seq}) ignored: {item.problem}: {item.line}"
        if last:
            message += " (further malformed lines of this pod are not reported)"
        self._warn(pod, "MalformedResult", message, name_suffix=f"result-{item.seq}")

    def _warn(self, pod: Mapping[str, Any], reason: str, message: str, *, name_suffix: str) -> None:
        """A Warning Event on the pod's Trial.  Its name is fixed by the pod and the line, so
        reading the log again after a restart does not report the same line twice."""
        meta = pod["metadata"]
        owner = next((ref for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "Trial"), None)
        if owner is None:
            return
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": reason, "message": message[:1024],
                "metadata": {"name": f"{meta['name']}.{name_suffix}", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": owner["apiVersion"], "kind": "Trial", "name": owner["name"],
                                   "uid": owner["uid"], "namespace": meta["namespace"]},
                "source": {"component": "kubetune"}, "reportingComponent": "kubetune",
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self._api.create_event(meta["namespace"], body)    # False: posted before (409)
        except Exception as error:  # noqa: BLE001 - a lost warning must not stop the results
            log.warning("cannot post %s for pod %s: %s", reason, meta["name"], error)
