"""The trial-side API: what a user's training function calls.

```python
import kubetune

def train(config):
    start = kubetune.get_checkpoint()          # a local directory, or None
    for step in range(100):
        loss = ...
        kubetune.report({"val_loss": loss}, checkpoint=some_dir)
```

Each call goes to the *session* of the trial running on the calling thread: the
function runner binds it to the thread that runs the user's function, and a thread
started from a bound thread (or from one of its threads) inherits that session for
good.  So a thread a trial leaves behind keeps reporting into its own, ended
session, which drops the reports with a warning: it never reaches the next trial
a pooled worker hosts.  A thread of unknown origin (started outside any trial, or
natively, without ``threading.Thread``) has no session: a trial worker used to
hand it the process's only running trial, which let a stray thread of trial A
report ``loss: 999`` into trial B (measured), so it now gets ``NoTrialError``.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from kubetune.spec.trial_key import TrialKey


class TrialStopped(BaseException):
    """Raised by ``report()`` once the trial was told to stop; ends the user's function.

    A ``BaseException`` so that a broad ``except Exception`` in user code does not
    swallow it; the function runner catches it and ends the trial as stopped.
    """


class TrialDone(BaseException):
    """Raised after a result that says ``done: True`` (Ray Tune's way for a trial to say it
    finished): ends the user's function as if it had returned."""


class NoTrialError(RuntimeError):
    """A trial-side API function was called outside a running trial."""


@dataclass(frozen=True)
class TrialContext:
    trial_key: str            # "<namespace>/<experiment>/<trial>"
    attempt: int              # 0 for the first run, +1 per retry
    iteration: int            # last reported iteration (start_iteration before the first report)
    start_iteration: int      # iterations already done when this attempt started
    should_checkpoint: bool   # a pause is waiting for the next report that carries a checkpoint
    should_stop: bool = False # a stop is waiting for the next report: a long step may cut short

    @property
    def namespace(self) -> str:
        return TrialKey.parse(self.trial_key).namespace

    @property
    def experiment(self) -> str:
        return TrialKey.parse(self.trial_key).experiment

    @property
    def trial_name(self) -> str:
        return TrialKey.parse(self.trial_key).trial


class Session(Protocol):
    def report(self, metrics: Mapping[str, Any], checkpoint: str | os.PathLike | None) -> None: ...
    def get_config(self) -> dict: ...
    def get_checkpoint(self) -> str | None: ...
    def get_context(self) -> TrialContext: ...


_thread = threading.local()
_patch_lock = threading.Lock()


def bind(session: Session) -> None:
    """Make ``session`` the current one for the calling thread (function runner only)."""
    _inherit_sessions_in_new_threads()
    _thread.session = session


def unbind(session: Session) -> None:
    if getattr(_thread, "session", None) is session:
        _thread.session = None


def current_session() -> Session | None:
    """The session bound to this thread, or inherited from the thread that started it."""
    session = getattr(_thread, "session", None)
    if session is not None:
        return session
    return getattr(threading.current_thread(), _INHERITED, None)


_INHERITED = "_kubetune_session"
_original_start = threading.Thread.start
_patched = False


def _start_with_session(thread: threading.Thread) -> None:
    session = current_session()
    if session is not None:
        setattr(thread, _INHERITED, session)
        adopt = getattr(session, "adopt_thread", None)
        if adopt is not None:     # the session knows its threads: a host retires a worker they outlive
            adopt(thread)
    _original_start(thread)


def _inherit_sessions_in_new_threads() -> None:
    """Threads started from now on inherit their starter's session (once per process).

    Python gives a new thread nothing of its starter's thread-locals (nor, before
    3.14, of its context), so ``Thread.start`` records the session on the thread.
    """
    global _patched
    with _patch_lock:
        if not _patched:
            threading.Thread.start = _start_with_session
            _patched = True


def _require(what: str) -> Session:
    session = current_session()
    if session is None:   # in a trial pod (executor: pod) the process itself is the trial
        from kubetune.trainable.pod_session import pod_session
        session = pod_session()
    if session is None:
        raise NoTrialError(
            f"kubetune.{what}() was called outside a trial: it only works inside the "
            "function named by spec.trial.entrypoint while kubetune runs it")
    return session


def report(metrics: Mapping[str, Any], checkpoint: str | os.PathLike | None = None) -> None:
    """Record one result (one iteration) and, optionally, persist a checkpoint directory.

    ``metrics`` maps names to numbers (also strings, booleans, lists); numpy scalars
    are converted. ``checkpoint`` is a directory the function filled; it is copied to
    the experiment's checkpoint storage before this returns, so the function may
    reuse or delete it afterwards. Unlike Ray Tune's blocking report this returns at
    once: results are buffered and fetched in batches by the operator.  In a trial pod
    (executor: pod) it returns once the operator has the result (see pod_session.py).
    """
    _require("report").report(metrics, checkpoint)


def get_config() -> dict:
    """The trial's configuration: sampled parameters merged over spec.trial.config."""
    return _require("get_config").get_config()


def get_checkpoint() -> str | None:
    """A local directory holding the checkpoint to resume from, or None for a fresh start."""
    return _require("get_checkpoint").get_checkpoint()


def get_context() -> TrialContext:
    """Who and where this trial is: key, attempt, iteration, whether to checkpoint now."""
    return _require("get_context").get_context()
