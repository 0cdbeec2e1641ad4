"""Waiting on a condition from inside an event loop, shared by the unit and the integration
tests (``tests`` is on pytest's ``pythonpath``). Never a fixed sleep: a condition and a
deadline, so a loaded machine only makes the wait longer, never the test wrong."""
from __future__ import annotations

import asyncio


async def until(condition, what: str = "the condition", deadline: float = 60.0) -> None:
    """``wait_for`` on an event loop: yield to the loop's other tasks (and to threads the test
    started) until ``condition()``, failing once ``deadline`` seconds have passed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, f"never happened: {what}"
        await asyncio.sleep(0.01)     # the poll interval of the deadline wait, not a pause
