"""A Ray call in flight when its cluster's head stops blocks until a GCS answers again
(liveness.py: the operator sets Ray's reconnect timeout far out, so an outage does not
end its process).  Run in a thread under the platform's lock, such a call would hold
every Experiment's cycle on that cluster, and so their RayUnavailable condition, for
the whole outage.  Imports no Ray: the platform module must load where Ray is absent."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

STUCK_CALL_CHECK_S = 5.0


async def outage_bounded(future: "asyncio.Future[Any]", endpoint: Callable[[], tuple[str, int] | None],
                         unavailable: Callable[[str], BaseException], check_s: float = STUCK_CALL_CHECK_S) -> Any:
    """Await a Ray call running in a thread; every ``check_s`` it has not answered, probe
    the GCS port (``endpoint()``, None: nothing to probe) from the event loop, and once the
    port refuses connections give up on the call with ``unavailable(why)``.  The thread
    stays blocked (nothing can interrupt it); its eventual outcome is dropped.  A slow call
    to a GCS that still accepts connections is waited for: load is not an outage.  A call
    that fails while the port refuses fails with ``unavailable(why)`` too."""
    target = endpoint()     # read first: a call that fails on a lost cluster drops its watch
    while True:
        done, _ = await asyncio.wait({future}, timeout=check_s)
        target = endpoint() or target
        if done:
            try:
                return future.result()
            except Exception as error:
                # a call that failed because the head went away says so in Ray's words
                # ("RPC error: CANCELLED"); the condition a user reads names the cause
                refused = await _refusal(target) if target is not None else ""
                if refused:
                    raise unavailable(_why(target, refused)) from error
                raise
        refused = await _refusal(target) if target is not None else ""
        if refused:
            future.add_done_callback(_drop_outcome)
            raise unavailable(_why(target, refused) + " while a call to Ray waited for it")


def _why(target: tuple[str, int], refused: str) -> str:
    return f"the Ray GCS at {target[0]}:{target[1]} is unreachable ({refused})"


async def _refusal(target: tuple[str, int], timeout_s: float = 2.0) -> str:
    """Why the port refuses connections (or its host cannot be reached); "" when it
    accepts, or when a connection does not complete in time (a loaded machine)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*target), timeout_s)
    except asyncio.TimeoutError:
        return ""
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    writer.close()
    return ""


def _drop_outcome(future: "asyncio.Future[Any]") -> None:
    if not future.cancelled():
        future.exception()      # retrieved: no "exception was never retrieved" warning
