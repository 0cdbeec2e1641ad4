"""A study's search spaces, user attribute names and whether it has intermediate
values (the study-detail body's ``intersection_search_space``, ``union_search_space``,
``union_user_attrs``, ``has_intermediate_values``), as optuna-dashboard computes them,
from the few trials that decide them.

optuna-dashboard folds every trial into them (``get_cached_extra_study_property``):
~0.5 s for 10,000 trials, each merging its distributions into sets of distributions
hashed again and again.  What a trial adds depends only on its kind: its state being
FAIL or not, whether it has intermediate values, its user attributes' names and
whether each is a number, and its distributions.  A trial of a kind already folded
twice changes nothing, because every merge is then a fixed point:

- user attribute names keep the order they were first seen in, and a name's
  "sortable" only goes from true to false; "has intermediate values" only turns true;
- ``ResultsStoreStorage`` gives every trial of a study one distribution per parameter
  (``distributions_for``; equal objects, the same one but across refreshes), so merging
  two of a name gives the same range, and a categorical one's choices in the order
  ``list(set(choices))`` gives, which merging again keeps (the first merge changes a
  categorical's order: hence twice, not once).

So only the first two trials of each kind, in the order optuna-dashboard folds them
(newest first), are folded, on a cache of its own each time: the answer then depends
on the study's trials alone, as a freshly started optuna-dashboard's does.  When two
trials hold different distributions for one parameter (not a study our storage made)
every trial is folded, as optuna-dashboard does."""
from __future__ import annotations

import numbers
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from kubetune.dashboard import dashboard_compat as odc
from kubetune.dashboard.packed_trial import has_intermediate_values

FOLDS_TO_SETTLE = 2


def extra_study_property(study_id: int, trials: list[FrozenTrial]) -> tuple[list, list, list, bool]:
    """(intersection, union, union_user_attrs, has_intermediate_values), as
    ``get_cached_extra_study_property`` answers on a fresh cache."""
    return odc.get_cached_extra_study_property(odc.InMemoryCache(), study_id, deciding_trials(trials))


def deciding_trials(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials whose folding gives what folding all of them gives (see above), in order."""
    shared: dict[str, BaseDistribution] = {}
    folded: dict[tuple, int] = {}
    kept: list[FrozenTrial] = []
    for trial in reversed(trials):   # optuna-dashboard folds the newest first
        distributions = trial.distributions
        for name, distribution in distributions.items():
            first = shared.setdefault(name, distribution)
            if first is not distribution and first != distribution:
                return trials
        kind = _kind(trial, distributions)
        seen = folded.get(kind, 0)
        if seen < FOLDS_TO_SETTLE:
            folded[kind] = seen + 1
            kept.append(trial)
    kept.reverse()
    return kept


def _kind(trial: FrozenTrial, distributions: dict[str, Any]) -> tuple:
    """What folding ``trial`` adds depends on this alone (given one distribution per name)."""
    sortable = tuple((name, not isinstance(value, bool) and isinstance(value, numbers.Real))
                     for name, value in trial.user_attrs.items())
    return (trial.state == TrialState.FAIL, has_intermediate_values(trial), sortable, tuple(distributions))
