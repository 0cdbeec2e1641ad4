"""A finished Trial loses its ``metadata.managedFields`` (issue 26).

The API server records on every object which manager last wrote which field: for a
Trial, the operator's create (~450 B) and its status writes (~900 B, one key per status
field), half of a finished one-result Trial.  ``kubectl get trials`` asks for every
row's metadata, so on 10,000 Trials that record was two thirds of what it read (3.2 s
with it, 2.5 s without: BENCHMARKS.md, Scale).  Nobody applies to a Trial (server-side
apply) and once it is finished only its status is ever written again, by the operator:
the record serves no one.  So once a Trial's terminal status is written, one merge PATCH
of the main resource, ``metadata: {managedFields: [{}]}``, strips it.  Measured on
v1.34: the same inside the status-subresource patch is ignored (the status strategy
keeps the live metadata), and once stripped, the API server records nothing for later
Updates either, so once is enough.  A running Trial keeps its record.

A strip is never needed for the trial's status: one that fails is logged and tried again
at a later flush, after a backoff, at most ``MAX_TRIES`` times; a refusal retrying cannot
cure (403: a Role without ``patch`` on trials; 422) ends stripping for the Experiment,
with one warning.  A restored Experiment (running, or finished with its spec changed
since) strips its finished Trials that still carry a record; one that finished before
the restart is not restored at all, so a strip still owed then is left out (the how-to
troubleshooting page gives the ``kubectl patch`` that does it by hand)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from kubetune.controller.write_failures import backoff
from kubetune.core.types import TrialPhase

MAX_TRIES = 3
PER_FLUSH = 16          # strips a flush sends at once (the rest wait for the next flush)
TERMINAL_PHASES = frozenset(phase.value for phase in TrialPhase if phase.is_terminal)   # as written in status


def needs_strip(trial: Mapping[str, Any]) -> bool:
    """A Trial as the API server returns it: finished, and still carrying a record."""
    finished = (trial.get("status") or {}).get("phase") in TERMINAL_PHASES
    return finished and bool((trial.get("metadata") or {}).get("managedFields"))


class ManagedFieldsStrip:
    """The finished Trials whose record is still to be stripped, with their retries."""

    def __init__(self) -> None:
        self._due: dict[str, tuple[int, float]] = {}     # name -> (failed tries, not before)
        self.refused: str | None = None    # why stripping ended for good (a 403, a 422)

    def __bool__(self) -> bool:
        return bool(self._due)

    def finished(self, name: str, status: Mapping[str, Any]) -> None:
        """A Trial's status was written: once it is terminal, its strip is due (once)."""
        if status.get("phase") in TERMINAL_PHASES and self.refused is None:
            self._due.setdefault(name, (0, float("-inf")))

    def restored(self, trials: Iterable[Mapping[str, Any]]) -> None:
        """After a restart: the finished Trials an earlier run did not strip."""
        for trial in trials:
            if needs_strip(trial) and self.refused is None:
                self._due.setdefault(trial["metadata"]["name"], (0, float("-inf")))

    def refuse(self, why: str) -> bool:
        """A refusal retrying cannot cure: no more strips; True the first time (warn once)."""
        first = self.refused is None
        self.refused = self.refused or why
        self._due.clear()
        return first

    def due(self, now: float, limit: int = PER_FLUSH) -> list[str]:
        return [name for name, (_, not_before) in self._due.items() if not_before <= now][:limit]

    def stripped(self, name: str) -> None:
        self._due.pop(name, None)

    def failed(self, name: str, now: float) -> bool:
        """A strip was refused: tried again after a backoff; True once it is given up."""
        if self.refused is not None:
            return True
        tries = self._due.get(name, (0, 0.0))[0] + 1
        if tries >= MAX_TRIES:
            self._due.pop(name, None)
            return True
        self._due[name] = (tries, now + backoff(tries))
        return False
