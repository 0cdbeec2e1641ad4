"""Optuna's private names, used through core/optuna_compat.py only: each is called here as
kubetune calls it, so an Optuna upgrade that moves or changes one fails this file, by
name, before any scheduler misbehaves.  (Importing the adapter is the first check: a
moved module fails at the import, naming it.)"""
from __future__ import annotations

import copy
import pathlib
import re

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

import kubetune
from kubetune.core import optuna_compat

X = {"x": FloatDistribution(0.0, 1.0)}


def finished(x: float, value: float) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(params={"x": x}, distributions=X, value=value, state=TrialState.COMPLETE)


def test_trials_are_added_found_and_replaced_by_storage_id():
    study = optuna.create_study()
    first = optuna_compat.add_trial(study, finished(0.1, 1.0))
    second = optuna_compat.add_trial(study, finished(0.2, 0.5))
    assert first != second
    assert optuna_compat.trial_id_of_number(study, 1) == second
    assert optuna_compat.trial_id(study.trials[0]) == first
    running = study.ask(X)
    assert optuna_compat.trial_id(running) == optuna_compat.trial_id_of_number(study, 2)
    storage = optuna_compat.storage(study)
    storage.set_trial_intermediate_value(optuna_compat.trial_id(running), 1, 0.3)
    storage.set_trial_intermediate_value(optuna_compat.trial_id(running), 2, 0.2)
    trimmed = copy.copy(storage.get_trial(optuna_compat.trial_id(running)))
    trimmed.intermediate_values = {2: 0.2}
    optuna_compat.replace_trial(study, optuna_compat.trial_id(running), trimmed)
    assert storage.get_trial(optuna_compat.trial_id(running)).intermediate_values == {2: 0.2}


def test_distribution_membership():
    assert optuna_compat.contains(X["x"], 0.5)
    assert not optuna_compat.contains(X["x"], 1.5)
    assert not optuna_compat.contains(X["x"], "a string")          # refused, not raised
    assert optuna_compat.contains(CategoricalDistribution(["a", 1]), 1)


def test_samplers_hold_their_random_state_where_reseeding_looks():
    sampler = optuna.samplers.TPESampler(seed=1)
    states = [v for v in vars(sampler).values() if isinstance(v, optuna_compat.LazyRandomState)]
    assert states and all(hasattr(state, "rng") for state in states)
    held = [v for v in vars(sampler).values() if isinstance(v, optuna.samplers.BaseSampler)]
    assert held, "TPESampler should hold its startup sampler as an attribute"


def test_a_qmc_sampler_skips_points():
    # QMC numbers its points in a study attribute: a skip takes the next number, as an ask would
    sampler = optuna.samplers.QMCSampler(seed=0, scramble=True, warn_independent_sampling=False)
    study = optuna.create_study(sampler=sampler)
    before = dict(optuna_compat.storage(study).get_study_system_attrs(study._study_id))
    for _ in range(3):
        optuna_compat.skip_qmc_point(sampler, study, X)
    after = optuna_compat.storage(study).get_study_system_attrs(study._study_id)
    counters = {key: value for key, value in after.items() if key.startswith("qmc:") and key not in before}
    assert list(counters.values()) == [2]       # points 0, 1 and 2 taken


def test_hyperband_brackets_are_built_and_read():
    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=27, reduction_factor=3)
    study = optuna.create_study(pruner=pruner)
    optuna_compat.hyperband_ready(pruner, study)
    optuna_compat.add_trial(study, finished(0.1, 1.0))
    bracket = optuna_compat.hyperband_bracket(pruner, study, study.trials[0])
    assert 0 <= bracket < 4        # log_3(27) + 1 brackets
    # the plan (kubetune plan) reads brackets of a study that does not exist yet: only its
    # name and the trial's number may be read
    from types import SimpleNamespace
    planned = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=27, reduction_factor=3)
    named = SimpleNamespace(study_name=study.study_name)
    optuna_compat.hyperband_ready(planned, named)
    assert optuna_compat.hyperband_bracket(planned, named, SimpleNamespace(number=0)) == bracket


def test_multi_objective_helpers():
    losses = np.asarray([[1.0, 2.0], [2.0, 1.0], [3.0, 3.0]])
    assert list(optuna_compat.is_pareto_front(losses, assume_unique_lexsorted=False)) == [True, True, False]
    assert list(optuna_compat.fast_non_domination_rank(losses)) == [0, 0, 1]
    assert float(optuna_compat.compute_hypervolume(losses[:2], np.asarray([3.0, 3.0]))) == 3.0
    assert optuna_compat.default_gamma(100) == 10
    study = optuna.create_study(directions=["minimize", "minimize"])
    for x, values in ((0.1, [1.0, 2.0]), (0.2, [2.0, 1.0]), (0.3, [3.0, 3.0])):
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=X, values=values))
    front = optuna_compat.pareto_front_trials(study.trials, study.directions, consider_constraint=True)
    assert sorted(t.params["x"] for t in front) == [0.1, 0.2]


def test_no_private_optuna_name_outside_the_adapter():
    """The adapter is the one place: a private module import or a private attribute of a
    study, trial, storage, sampler, pruner or distribution anywhere else fails here."""
    private = re.compile(r"optuna\.[\w.]*\._\w+|from optuna[\w.]* import _\w+|"
                         r"\b(study|storage|sampler|pruner|distribution|trial|frozen)\._(?!_)\w+")
    package = pathlib.Path(kubetune.__file__).parent
    found = {str(path.relative_to(package)): line.strip() for path in package.rglob("*.py")
             if path.name != "optuna_compat.py"
             for line in path.read_text().splitlines() if private.search(line)}
    assert found == {}
    assert private.search("from optuna.study._multi_objective import _is_pareto_front")
    assert private.search("        storage = study._storage")


def test_the_dashboards_names_are_optunas():
    assert optuna_compat.CONSTRAINTS_KEY == "constraints"     # Optuna's samplers read constraint values there
    study = optuna_compat.FrozenStudy(study_name="s", direction=None, directions=[optuna.study.StudyDirection.MINIMIZE],
                                      user_attrs={}, system_attrs={}, study_id=0)
    assert study.study_name == "s"
