"""Confining kubetune's own processes with what an unprivileged pod has: Landlock and
prctl (landlock.py).  Who uses it: the operator makes itself not dumpable at start
(operator_main.py), and each Ray driver process for another cluster confines itself
before it imports Ray (executors/ray/sandbox.py).  Imports nothing of kubetune."""
