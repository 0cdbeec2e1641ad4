"""What a Trial's status cannot show of the results its trial reported, said once.

The status is bounded (render.py): a string metric is cut to its first
``MAX_SHOWN_STRING_CHARS`` characters, ``lastMetrics`` keeps what fits in
``MAX_METRICS_BYTES``, and ``history`` keeps 64 points however many results come. Each
is right, but done silently it reads as a lost value or a frozen trial. So the first time
a trial's results are cut, and the first time they come faster than anyone reads a
status (``FLOOD_RESULTS`` or more within one second, by the trial's own timestamps,
however the fetches split them), the controller
posts one Warning Event on the Trial saying what was cut, and that the results store
keeps every result whole. Pure: the caller posts the Events.
"""
from __future__ import annotations

from typing import Sequence

from kubetune.controller.render import MAX_METRICS_BYTES, MAX_SHOWN_STRING_CHARS
from kubetune.core.sanitize import json_safe, json_size
from kubetune.spec.results import Result

CUT = "ResultCut"                 # a value or a metric the status does not show
THINNED = "ResultsThinned"        # more results than the status shows one by one
FLOOD_RESULTS = 1_000             # within FLOOD_WINDOW_S
FLOOD_WINDOW_S = 1.0


class ResultNotes:
    """One per Experiment: remembers which (trial, reason) was said already."""

    def __init__(self, experiment: str) -> None:
        self.experiment = experiment
        self._said: set[tuple[str, str]] = set()
        self._windows: dict[str, tuple[float, int]] = {}   # trial -> (window start, results in it)

    def notes(self, trial: str, results: Sequence[Result], history_stride: int = 1) -> list[tuple[str, str]]:
        """(reason, message) of the Warnings to post for this batch of ``trial``'s results."""
        found: list[tuple[str, str]] = []
        where = f"every result is kept whole in the results store: kubetune results {self.experiment} --trial {trial}"
        if (trial, CUT) not in self._said:
            cut = _cut(results)
            if cut:
                found.append((CUT, f"{trial}: {cut}; {where}"))
        if (trial, THINNED) not in self._said and self._flooded(trial, results):
            found.append((THINNED, (
                f"{trial}: {FLOOD_RESULTS:,} results or more within one second; its status shows the latest, "
                f"and its history one point every {history_stride} iterations (64 at most); {where}. "
                "Report less often (once per epoch or evaluation) to follow it with kubectl")))
            self._windows.pop(trial, None)
        self._said |= {(trial, reason) for reason, _ in found}
        return found

    def _flooded(self, trial: str, results: Sequence[Result]) -> bool:
        """FLOOD_RESULTS results within FLOOD_WINDOW_S, counted across batches."""
        start, count = self._windows.get(trial, (float("-inf"), 0))
        flooded = False
        for result in results:
            if result.timestamp - start > FLOOD_WINDOW_S:
                start, count = result.timestamp, 0
            count += 1
            flooded |= count >= FLOOD_RESULTS
        self._windows[trial] = (start, count)
        return flooded


def _cut(results: Sequence[Result]) -> str:
    """What of these results the status cuts, in words; "" if nothing."""
    for result in results:
        for name, value in result.metrics.items():
            if isinstance(value, str) and len(value) > MAX_SHOWN_STRING_CHARS:
                return (f"metric {name[:80]!r} is a {len(value):,}-character string; the Trial's status "
                        f"shows its first {MAX_SHOWN_STRING_CHARS}")
        size = json_size(json_safe(dict(result.metrics), max_string=MAX_SHOWN_STRING_CHARS))
        if size > MAX_METRICS_BYTES:
            return (f"a result of {len(result.metrics)} metrics is {size:,} bytes of JSON; the Trial's "
                    f"lastMetrics shows the objective and those that fit in {MAX_METRICS_BYTES:,} bytes")
    return ""
