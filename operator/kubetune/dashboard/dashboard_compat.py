"""Every private name of optuna-dashboard that kubetune uses, in one place.

``detail.StudyDetails`` answers the study-detail API itself (see there why) and must
answer exactly what optuna-dashboard's own view does, so it calls that view's own
pieces: its serializers, its trial cache, its search-space cache and its Pareto front.
They live in optuna-dashboard's private modules; tests/unit/test_dashboard_compat.py
checks each name, so an upgrade that moves one fails there, by name.
pyproject.toml pins ``optuna-dashboard<1``."""
from __future__ import annotations

from optuna_dashboard._inmemory_cache import InMemoryCache, get_cached_extra_study_property  # noqa: F401
from optuna_dashboard._pareto_front import get_pareto_front_trials  # noqa: F401 - re-exported
from optuna_dashboard._serializer import (serialize_distribution, serialize_frozen_trial,  # noqa: F401
                                         serialize_study_detail)
from optuna_dashboard._storage import get_study, get_trials  # noqa: F401 - re-exported


def app_cache(app):
    """The dashboard app's own cache of trial lists and search spaces (``create_app``
    keeps it on the Bottle app), shared so every view sees the same trials."""
    return app._inmemory_cache
