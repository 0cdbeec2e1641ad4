"""The Ray actor class of a trial worker (see executors/ray/executor.py).

In a module of its own that imports only Ray and ``kubetune.trainable``: every
worker process imports the module its actor class lives in, and the rest of
``executors.ray`` pulls in the core (Optuna, NumPy), which took 0.2-0.6 s of CPU
per worker start on a 2-core machine."""
from __future__ import annotations

import os

import ray

from kubetune.trainable.host import TrialHost


class RayTrialHost(TrialHost):
    def __init__(self, name: str, pool_key: str, shape: dict, launch: dict | None,
                 idle_timeout_s: float, orphan_timeout_s: float, lease_timeout_s: float = 0.0):
        context = ray.get_runtime_context()
        super().__init__(name, pool_key, info={"node_id": context.get_node_id(), "shape": shape},
                         idle_timeout_s=idle_timeout_s, orphan_timeout_s=orphan_timeout_s,
                         on_idle=self._exit, lease_timeout_s=lease_timeout_s)
        if launch is not None:     # creation and first assignment in one step: no orphan window
            self.assign(launch)

    def _exit(self) -> None:
        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        except Exception:  # noqa: BLE001 - leave one way or another
            os._exit(0)


HostActor = ray.remote(RayTrialHost)
