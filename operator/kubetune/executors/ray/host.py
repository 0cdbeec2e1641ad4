"""The Ray actor class of a trial worker (see executors/ray/executor.py).

In a module of its own that imports only Ray and ``kubetune.trainable``: every
worker process imports the module its actor class lives in, and the rest of
``executors.ray`` pulls in the core (Optuna, NumPy), which took 0.2-0.6 s of CPU
per worker start on a 2-core machine.

Every call the executor makes takes ``answer_to`` first and answers there as JSON
(answers.py), returning nothing: the operator never unpickles what this process,
which runs the user's code, hands back."""
from __future__ import annotations

import os

import ray

from kubetune.executors.ray.answers import answer
from kubetune.trainable.host import TrialHost


class RayTrialHost(TrialHost):
    def __init__(self, name: str, pool_key: str, shape: dict, launch: dict | None,
                 idle_timeout_s: float, orphan_timeout_s: float, lease_timeout_s: float = 0.0):
        context = ray.get_runtime_context()
        super().__init__(name, pool_key, info={"node_id": context.get_node_id(), "shape": shape},
                         idle_timeout_s=idle_timeout_s, orphan_timeout_s=orphan_timeout_s,
                         on_idle=self._exit, lease_timeout_s=lease_timeout_s)
        if launch is not None:     # creation and first assignment in one step: no orphan window
            TrialHost.assign(self, launch)

    def assign(self, answer_to, launch: dict) -> None:
        answer(answer_to, TrialHost.assign(self, launch))

    def fetch(self, answer_to, trial_key: str, after_seq: int, limit: int = 1000, wait_s: float = 0.0) -> None:
        answer(answer_to, TrialHost.fetch(self, trial_key, after_seq, limit, wait_s))

    def stop(self, answer_to, trial_key: str, timeout_s: float = 5.0, after_seq: int | None = None,
             at_checkpoint: bool = False) -> None:
        answer(answer_to, TrialHost.stop(self, trial_key, timeout_s, after_seq, at_checkpoint))

    def release(self, answer_to, trial_key: str) -> None:
        answer(answer_to, TrialHost.release(self, trial_key))

    def describe(self, answer_to) -> None:
        answer(answer_to, TrialHost.describe(self))

    def logs(self, answer_to, trial_key: str, lines: int = 200) -> None:
        answer(answer_to, TrialHost.logs(self, trial_key, lines))

    def _exit(self) -> None:
        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        except Exception:  # noqa: BLE001 - leave one way or another
            os._exit(0)


HostActor = ray.remote(RayTrialHost)
