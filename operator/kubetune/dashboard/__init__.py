"""``kubetune dashboard``: optuna-dashboard (the PyPI package; kubetune draws no UI of
its own) over the results store.  ``storage.ResultsStoreStorage`` is the results store
as a read-only Optuna storage, each Experiment a study; ``study`` turns rows into
Optuna's frozen trials (pure); ``server`` serves the dashboard's WSGI app;
``command`` is the CLI.

May import: results/, spec/ (values only), optuna, optuna_dashboard, and Optuna's private
names only through core/optuna_compat.py; never Ray or the Kubernetes client."""
