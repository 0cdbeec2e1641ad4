"""The entry point of a Ray driver process (process.py starts ``python -m`` this): the
sandbox first (sandbox.py), then everything else.

A module of its own because the sandbox has to be entered while the process has one
thread, and importing kubetune's executor (numpy, through optuna) starts OpenBLAS's
threads, which Landlock would leave outside it.  So nothing is imported here before
``confine`` but the standard library and the sandbox itself.

argv: the fd of the socket to the operator, and the settings as JSON (``address``,
``workdir``, ``sandbox``, and the ``RayExecutor``'s keyword arguments; ``landlock_abi``:
an older ABI than the kernel's, for tests of how the sandbox degrades).
"""
from __future__ import annotations

import json
import sys


def enter(settings: dict) -> bool:
    """Enter the sandbox the settings ask for (``sandbox``: false only where the operator
    was told to run drivers without one); whether it did.  A failure (no Landlock here)
    raises, and ends the child: the operator then reports its cluster unavailable."""
    version = settings.pop("landlock_abi", None)
    if not settings.pop("sandbox"):
        return False
    from kubetune.executors.ray import sandbox
    sandbox.confine(settings["address"], settings["workdir"], version=version)
    return True


def main(argv: list[str]) -> None:
    fd, settings = int(argv[0]), json.loads(argv[1])
    sandboxed = enter(settings)
    from kubetune.executors.ray import process
    process.main(fd, settings, sandboxed)


if __name__ == "__main__":
    main(sys.argv[1:])
