"""LISTs of the Trials of one namespace's Experiments, sent together (issue 26).

Every Experiment the operator builds (a new one, or one restored after a restart) first
LISTs its Trials; nothing of it is created before that answer.  200 Experiments applied
at once made 200 LISTs, each waiting for the operator's rate limit and a thread
(k8s/store.py) behind the others, and their first Trials waited seconds for them.  Now
a LIST asked while another one of the same namespace still waits to be sent joins it:
one request, selector ``kubetune.dev/experiment in (a, b, ...)``, answers all of them,
and each asker gets the Trials labelled with its Experiment.  Nothing is held back to
make a batch: a LIST asked when the operator has room goes at once, alone, as before."""
from __future__ import annotations

import asyncio
import weakref
from typing import Any, Awaitable, Callable


# Experiments per request: the selector (label values are at most 63 characters) stays a
# few KiB of URL, and one request's answer a bounded number of Trials' pages
MAX_BATCH = 40
MAX_LABEL_VALUE = 63

# admit(): wait until a request may be sent (rate limit, a thread); fetch(values): every
# Trial (all pages) whose label has one of ``values``, its first page admitted already
Admit = Callable[[], Awaitable[None]]
Fetch = Callable[[list[str]], Awaitable[list[dict[str, Any]]]]


class _Batch:
    def __init__(self) -> None:
        self.experiments: set[str] = set()
        self.answer: asyncio.Future | None = None


# per event loop (a process may run several, one after another: tests, benchmarks):
# namespace -> the batch still waiting for its token, which a new asker joins
_open: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Batch]]" = weakref.WeakKeyDictionary()


def label_selector(label: str, values: list[str]) -> str:
    return f"{label}={values[0]}" if len(values) == 1 else f"{label} in ({','.join(values)})"


async def trials_of(namespace: str, experiment: str, label: str, admit: Admit,
                    fetch: Fetch) -> list[dict[str, Any]]:
    """The Trials labelled ``label=experiment`` in ``namespace``, by one LIST shared with
    the other Experiments of the namespace asking meanwhile."""
    if len(experiment) > MAX_LABEL_VALUE:     # not a valid label value: its LIST fails alone
        return await _alone(experiment, admit, fetch)
    loop = asyncio.get_running_loop()
    waiting = _open.setdefault(loop, {})
    batch = waiting.get(namespace)
    if batch is None or len(batch.experiments) >= MAX_BATCH:
        batch = waiting[namespace] = _Batch()
        # a task of its own: an asker cancelled (its Experiment deleted) cancels nobody's LIST
        batch.answer = asyncio.ensure_future(_send(waiting, namespace, batch, admit, fetch))
    batch.experiments.add(experiment)
    try:
        items = await asyncio.shield(batch.answer)
    except Exception:  # noqa: BLE001 - the shared request's failure is not necessarily ours
        if len(batch.experiments) == 1:
            raise
        # each asker LISTs alone: one tenant's Experiment must not fail the others' LISTs
        # (a request refused for one of the values, a page expiring under a long answer)
        items = await _alone(experiment, admit, fetch)
    return [item for item in items if ((item.get("metadata") or {}).get("labels") or {}).get(label) == experiment]


async def _alone(experiment: str, admit: Admit, fetch: Fetch) -> list[dict[str, Any]]:
    """One Experiment's own LIST, shared with nobody."""
    await admit()
    return await fetch([experiment])


async def _send(waiting: dict[str, _Batch], namespace: str, batch: _Batch, admit: Admit,
                fetch: Fetch) -> list[dict[str, Any]]:
    try:
        await admit()     # open to joiners for as long as this waits
    finally:
        if waiting.get(namespace) is batch:
            del waiting[namespace]
    return await fetch(sorted(batch.experiments))     # no await before: admitted, it is sent
