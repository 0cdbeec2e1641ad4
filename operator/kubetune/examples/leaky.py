"""A trainable that leaves a thread reporting after it returns: for the tests that a
stray thread of one trial never reports into the next trial of the same worker.

Config:
- ``how``: ``thread`` (a ``threading.Thread``) or ``native`` (``_thread.start_new_thread``,
  as a native library's thread: the trial cannot know it started it);
- ``trace``: a file the stray thread appends a line to before each report it tries;
- ``release``: the stray thread ends once this file exists.

The function itself reports ``{"loss": 1.0}`` once and returns; the stray thread
waits for it to return, then reports ``{"loss": 999.0}`` every 10 ms.
"""
from __future__ import annotations

import _thread
import os
import threading
import time

import kubetune


def _stray(function: threading.Thread, trace: str, release: str) -> None:
    function.join()
    while not os.path.exists(release):
        with open(trace, "a") as f:
            f.write("report\n")
        try:
            kubetune.report({"loss": 999.0})
        except Exception:  # noqa: BLE001 - refused: keep trying, as a careless loop would
            pass
        time.sleep(0.01)


def train(config: dict) -> None:
    kubetune.report({"loss": 1.0})
    args = (threading.current_thread(), config["trace"], config["release"])
    if config.get("how", "thread") == "native":
        _thread.start_new_thread(_stray, args)
    else:
        threading.Thread(target=_stray, args=args, name="leaky-stray", daemon=True).start()
