"""The Ray platform: ``executor.RayExecutor`` (the ``TrialExecutor``, and its batched
poll), with ``slots`` (which actor hosts which trial; launching and ending trials),
``pool`` (actor names, creating actors, the idle pool), ``discovery`` (re-attaching
after a restart), ``liveness`` (the GCS watch), ``capacity`` (what the cluster
offers), ``autoscaler`` (node types), ``errors`` (which Ray errors mean "unreachable"),
``answers`` (the actor class a worker runs, and reading its JSON answers), and
``connection`` (``RayConnection``: the typed protocol ``platform.RayPlatform`` holds its
executor by, served by ``RayExecutor`` and by ``process.DriverProcess``).

May import: ray, executors.base, core/, trainable/.  Imports nothing itself: a Ray
worker imports ``answers`` alone, without the core (Optuna, NumPy; see answers.py)."""
