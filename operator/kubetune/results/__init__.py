"""The results store: every result a trial reports, kept outside etcd in a real
database (SQLite embedded by default, PostgreSQL in production), behind one small
interface (``ResultsStore``).  Trial and Experiment resources hold bounded state;
curves, export (``kubetune results``) and plots read from here.

    store = open_store(url)              # "sqlite:///path.db" or "postgresql://..."
    store.write(Batch(results=[...]))    # idempotent per (trial UID, result seq)
    store.results(experiment_uid)        # ResultRow, in (trial, seq) order

May import: core/ (value encoding), SQLAlchemy; never Ray or the Kubernetes client.
"""
from kubetune.results.rows import Batch, ExperimentRow, FailureRow, ResultRow, TrialRow, UsageRow
from kubetune.results.store import ResultsStore, default_url, open_store

__all__ = ["Batch", "ExperimentRow", "FailureRow", "ResultRow", "TrialRow", "UsageRow",
           "ResultsStore", "default_url", "open_store"]
