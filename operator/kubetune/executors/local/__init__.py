"""The local platform (``kubetune run --platform local``): each trial attempt is a
subprocess of this host, running the process a trial pod runs (trainable/run_entrypoint.py),
its results read from its output.  ``executor.LocalExecutor`` (the ``TrialExecutor``)
and ``platform.LocalPlatform`` (the ``Platform``, with ``LocalPlatforms``, its provider).
No Ray, no Kubernetes: for a laptop, CI, or a trial function being written.

May import: executors.base, executors.platform, executors.pods.stdout_results (the
result lines' format), core/, spec/."""
