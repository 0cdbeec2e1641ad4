"""Every private name of Optuna that kubetune uses, in one place.

Optuna's public API has no way to do a few things kubetune needs: add a finished trial
and learn its id (``Study.add_trial`` returns nothing), keep a trial's intermediate
values bounded (issue 14), reseed a sampler per ask (a restarted operator suggests what
it would have without the restart), and reuse Optuna's own Pareto, hypervolume and
Hyperband machinery instead of writing it again.  Those reach into Optuna's private
modules and attributes; they do it here only, and tests/unit/test_optuna_compat.py
checks each name and signature, so an Optuna upgrade that moves one fails there, by
name, instead of somewhere in a scheduler.  pyproject.toml pins ``optuna<6``."""
from __future__ import annotations

from typing import Any, Mapping

import optuna
from optuna._hypervolume import compute_hypervolume  # noqa: F401 - re-exported (pareto.py)
from optuna.distributions import BaseDistribution
from optuna.samplers._lazy_random_state import LazyRandomState  # noqa: F401 - re-exported (search.py)
from optuna.samplers._tpe.sampler import default_gamma  # noqa: F401 - re-exported (warm_box.py)
from optuna.storages import BaseStorage
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY as CONSTRAINTS_KEY  # noqa: F401 - re-exported
from optuna.study._frozen import FrozenStudy  # noqa: F401 - re-exported (dashboard/storage.py)
from optuna.study._multi_objective import (  # noqa: F401 - re-exported
    _fast_non_domination_rank as fast_non_domination_rank,
    _get_pareto_front_trials_by_trials as pareto_front_trials,
    _is_pareto_front as is_pareto_front,
)
from optuna.trial import FrozenTrial


def storage(study: optuna.Study) -> BaseStorage:
    return study._storage


def add_trial(study: optuna.Study, frozen: FrozenTrial) -> int:
    """``Study.add_trial``, returning the new trial's storage id."""
    return study._storage.create_new_trial(study._study_id, template_trial=frozen)


def trial_id(trial: FrozenTrial | optuna.trial.Trial) -> int:
    """The storage id of a frozen or a running trial."""
    return trial._trial_id


def trial_id_of_number(study: optuna.Study, number: int) -> int:
    return study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)


def replace_trial(study: optuna.Study, trial_id: int, frozen: FrozenTrial) -> None:
    """Put ``frozen`` in place of the stored trial (the in-memory storage only: it is
    used to trim a trial's intermediate values, which no public call can remove)."""
    study._storage._set_trial(trial_id, frozen)


def skip_qmc_point(sampler: optuna.samplers.QMCSampler, study: optuna.Study,
                   distributions: Mapping[str, BaseDistribution]) -> None:
    """Advance a QMC sampler by one point, as an ask would."""
    sampler._find_sample_id(study, distributions)


def contains(distribution: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` (external form) lies in ``distribution``."""
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except Exception:  # noqa: BLE001 - a value of another type: not contained
        return False


def hyperband_bracket(pruner: optuna.pruners.HyperbandPruner, study: optuna.Study, frozen: FrozenTrial) -> int:
    """The bracket the pruner puts a trial in: a hash of the study's name and the trial's
    number (all it reads of them: core/schedulers/hyperband.py plans brackets ahead)."""
    return pruner._get_bracket_id(study, frozen)


def hyperband_ready(pruner: optuna.pruners.HyperbandPruner, study: optuna.Study) -> None:
    """Build the pruner's brackets now (it builds them when it first judges a trial)."""
    if not pruner._pruners:
        pruner._try_initialization(study)
