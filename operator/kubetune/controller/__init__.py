"""One ``ExperimentController`` per Experiment: feeds the pure runner (core/) events
and the time, carries out its decisions on the Experiment's ``Platform``, persists
them as Trial resources through a ``Store``, and coalesces status writes.  The
controller is a coordinator of small parts (experiment.py lists them).

May import: core/, spec/, results/, metrics, executors.base and executors.platform (the
protocols, not a platform), k8s.errors, checkpoints/ (checkpoint storage for PBT copies
and deletion).  Never Ray, never the Kubernetes client, never executors/ray/ or
executors/pods/: the operator (handlers.py) and ``kubetune run`` (local_run.py) hand it
the platforms.  Enforced by tests/unit/test_seams.py."""
