"""A Ray call in flight when its cluster's head stops blocks until a GCS answers again
(liveness.py: the operator sets Ray's reconnect timeout far out, so an outage does not
end its process).  Run in a thread under the platform's lock, such a call would hold
every Experiment's cycle on that cluster, and so their RayUnavailable condition, for
the whole outage.  Imports no Ray: the platform module must load where Ray is absent."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

STUCK_CALL_CHECK_S = 5.0
# a GCS whose port neither accepts nor refuses for this long is gone (a replaced head Pod's
# old IP drops connections silently); shorter silences are a loaded machine's
SILENT_OUTAGE_S = 15.0
PROBE_TIMEOUT_S = 2.0


async def outage_bounded(future: "asyncio.Future[Any]", endpoint: Callable[[], tuple[str, int] | None],
                         unavailable: Callable[[str], BaseException], check_s: float = STUCK_CALL_CHECK_S,
                         *, on_give_up: Callable[[], None] = lambda: None,
                         silent_outage_s: float = SILENT_OUTAGE_S) -> Any:
    """Await a Ray call running in a thread; every ``check_s`` it has not answered, probe
    the GCS port (``endpoint()``, None: nothing to probe) from the event loop.  Once the
    port refuses connections, or has answered no connection for ``silent_outage_s``, give
    up on the call with ``unavailable(why)``: it is cancelled if it has not started, and
    ``on_give_up`` lets the caller stop queueing calls behind a thread that stays blocked
    (nothing can interrupt it; its eventual outcome is dropped).  A slow call to a GCS that
    still accepts connections is waited for: load is not an outage.  A call that fails
    while the port refuses fails with ``unavailable(why)`` too, naming the cause."""
    target = endpoint()     # read first: a call that fails on a lost cluster drops its watch
    silent_since: float | None = None
    while True:
        try:
            done, _ = await asyncio.wait({future}, timeout=check_s)
        except asyncio.CancelledError:
            future.add_done_callback(_drop_outcome)    # the caller went away: so does the outcome
            raise
        target = endpoint() or target
        if done:
            try:
                return future.result()
            except Exception as error:
                # a call that failed because the head went away says so in Ray's words
                # ("RPC error: CANCELLED"); the condition a user reads names the cause
                refused = await _refusal(target) if target is not None else ""
                if refused and refused != _SILENT:
                    raise unavailable(_why(target, refused)) from error
                raise
        refused = await _refusal(target) if target is not None else ""
        if refused == _SILENT:
            silent_since = time.monotonic() if silent_since is None else silent_since
            if time.monotonic() - silent_since < silent_outage_s:
                continue
            refused = f"no answer for {time.monotonic() - silent_since:.0f}s"
        elif not refused:
            silent_since = None
            continue
        future.cancel()     # not started yet (queued behind a blocked call): it never runs
        future.add_done_callback(_drop_outcome)
        on_give_up()
        raise unavailable(_why(target, refused) + " while a call to Ray waited for it")


_SILENT = "silent"


def _why(target: tuple[str, int], refused: str) -> str:
    return f"the Ray GCS at {target[0]}:{target[1]} is unreachable ({refused})"


async def _refusal(target: tuple[str, int], timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Why the port refuses connections (or its host cannot be reached); ``_SILENT`` when a
    connection neither completes nor fails in time; "" when it accepts."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*target), timeout_s)
    except asyncio.TimeoutError:
        return _SILENT
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    writer.close()
    return ""


def _drop_outcome(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()      # retrieved: no "exception was never retrieved" warning
