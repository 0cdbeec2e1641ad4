"""One ``ExperimentController`` per Experiment: feeds the pure runner (core/) events
and the time, carries out its decisions through an executor, persists them as Trial
resources through a ``Store``, and coalesces status writes.

May import: core/, spec/, results/, metrics, executors.base (the protocol, not a platform),
k8s.errors, checkpoints/ (checkpoint storage for PBT copies and deletion).
Never Ray, never the Kubernetes client, never executors/ray/ or executors/pods/:
the operator (handlers.py) and ``kubetune run`` (local_run.py) hand it the platform.
Enforced by tests/unit/test_seams.py."""
