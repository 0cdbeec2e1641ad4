"""``collection_paused()``: Python's cyclic garbage collector held off while a study's
trials are read and encoded in bulk.

A cold opening of 10,000 trials x 100 results makes a few hundred thousand objects
(frozen trials, their dicts, their JSON) that all live on in the caches.  Each
allocation burst counts towards the collector's thresholds, so it ran ~330 young and
2-3 full collections during one opening, the full ones walking every object of the
process (the imported modules' too): 0.13-0.3 s of a ~1 s opening's CPU, finding
nothing to free.  The collector runs again once the last bulk read ends, so the few
cycles made meanwhile are still freed.  Only a study's first read and first making
pause it (``storage``, ``detail``): later ones cost what changed, and a dashboard
polled all day by many pages never has the collector held off for long (the pauses of
several threads are counted: it runs again when the last one ends)."""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_holders = 0          # bulk reads under way (several threads may read at once)
_was_enabled = False  # the collector's state before the first of them


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _was_enabled:
                gc.enable()
