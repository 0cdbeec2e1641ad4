"""Side effects that run trials: one package per platform, each a ``platform.Platform``
(what the controller holds) over a ``base.TrialExecutor`` (start, poll results after a
sequence number, stop, pause, cluster capacity, logs, ``is_unavailable``).

- ``platform.py``: the Platform protocol, and the registry keyed by ``spec.executor``;
- ``base.py``: the executor protocol and the types it speaks (LaunchRequest, TrialUpdate, ...);
- ``ray/``: trials as named, detached Ray actors, the autoscaler request;
- ``pods/``: one Pod per trial attempt, results pushed over HTTP or read from the log.

May import: core/, spec/, k8s/, trainable/ (the code a Ray actor runs).  A platform's
own exceptions and client libraries stay inside its package; nothing here imports
controller/.  Kept free of imports so a Ray worker loading ``ray.answers`` (its actor class) stays light."""
