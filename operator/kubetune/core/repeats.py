"""When a sampler proposes parameters already evaluated: a Reused Trial (it takes the
earlier results and never runs), which does not count toward ``maxTrials``, and when to
call the search converged.

``maxTrials`` counts the trials that run, as Optuna's ``n_trials`` counts evaluations and
Katib's ``maxTrialCount`` its Trials. A sampler that has settled on a discrete space
(CMA-ES or TPE on a table of ordinals) proposes mostly configurations it has seen; if each
repeat used up a trial, the Experiment stopped searching long before its budget
(kubetune cmaes on hpobench-car: maxTrials 2,000 reached at 11% of the budget, ~1,780
of them Reused). Repeats are free instead, and the search ends, with reason
``SearchConverged``, when the sampler proposed nothing new ``REPEATS_IN_A_ROW`` times in a
row (Syne Tune's searchers give up after 100 duplicate draws of one suggestion; a sampler
that is told each repeat's result, as ours are, moves on within a few populations if it
can), or when the repeats reach ``maxTrials`` themselves, which bounds the Trial objects
an Experiment can make to twice ``maxTrials``. Pure: no I/O, no clock.
"""
from __future__ import annotations

from typing import Iterable

REUSED = "Reused"   # the reason of a Trial whose parameters were evaluated before: it never ran
REPEATS_IN_A_ROW = 25
SEARCH_CONVERGED = "SearchConverged"


class Repeats:
    def __init__(self) -> None:
        self.reused = 0          # Reused Trials so far
        self.in_a_row = 0        # the latest suggestions that were all repeats

    def note(self, reused: bool) -> None:
        """One more suggestion made into a Trial: a repeat or a new configuration."""
        self.reused += reused
        self.in_a_row = self.in_a_row + 1 if reused else 0

    def restore(self, reused_in_creation_order: Iterable[bool]) -> None:
        """After a restart: the same tally from the Trials, in creation order."""
        self.reused = self.in_a_row = 0
        for reused in reused_in_creation_order:
            self.note(reused)

    def counted(self, created: int) -> int:
        """The trials that count toward maxTrials: every created one but the repeats."""
        return created - self.reused

    def converged(self, max_trials: int) -> str:
        """Why the search is over ("" while it is not)."""
        if self.in_a_row >= REPEATS_IN_A_ROW:
            return (f"the search converged: its last {self.in_a_row} suggestions were all parameters already "
                    f"evaluated (Reused Trials, {self.reused} in all)")
        if self.reused >= max_trials:
            return (f"the search converged: {self.reused} of its suggestions were parameters already evaluated "
                    f"(Reused Trials), as many as maxTrials")
        return ""
