"""``kubetune dashboard``: optuna-dashboard (the PyPI package; kubetune draws no UI of
its own) over the results store.  ``storage.ResultsStoreStorage`` is the results store
as a read-only Optuna storage, each Experiment a study; ``study`` turns rows into
Optuna's frozen trials (pure); ``detail`` answers the study-detail API from JSON made
once per trial (a study's page opens in about a second at 10,000 trials x 100 results);
``server`` serves the dashboard's WSGI app; ``command`` is the CLI.

May import: results/, spec/ (values only), optuna, optuna_dashboard, Optuna's private
names only through core/optuna_compat.py and optuna-dashboard's through
``dashboard_compat``; never Ray or the Kubernetes client."""
