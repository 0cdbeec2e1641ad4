"""Pure decision logic: the trial runner, the resource ledger, search and schedulers.
No I/O, no clock, no platform (executors/), no Kubernetes: the controller feeds events and the time in.

May import: spec/ (the data model), Optuna, NumPy; nothing of kubetune above it
(tests/unit/test_purity.py)."""
from kubetune.core.resources import Resources, ResourceLedger, trial_bundles
from kubetune.core.runner import TrialRunner
from kubetune.core.search import Searcher
from kubetune.core.trial import TrialInfo

__all__ = ["TrialRunner", "ResourceLedger", "Resources", "trial_bundles", "Searcher", "TrialInfo"]
