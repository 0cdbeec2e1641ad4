"""A Ray head a test may stop (as `ray stop` does) and start again at the same address,
and an operator process connected to it."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from operator_fixtures import OperatorProcess
from kubetune.devcluster.processes import free_port
from ray_fixtures import end_processes, session_processes, start_ray_head, stop_ray_head

__all__ = ["RestartableRay", "OperatorWithEnv", "ray_restartable"]


class RestartableRay:
    """A small Ray head on a fixed port (``start_new_session``: its processes, workers
    included, share the session of the ``ray start`` process)."""

    def __init__(self, num_cpus: int = 4) -> None:
        self.port = free_port()
        self.num_cpus = num_cpus
        self.process = None
        self.address = ""
        self._temp_dirs: list[Path] = []

    def start(self) -> "RestartableRay":
        self.process, self.address, temp_dir = start_ray_head(num_cpus=self.num_cpus, num_gpus=0, port=self.port)
        self._temp_dirs.append(temp_dir)
        return self

    def stop(self, grace_s: float = 2.0) -> None:
        """What `ray stop` does, for this head only: SIGTERM to each of its processes at
        once, SIGKILL to what is left after ``grace_s``. (`ray start --block` alone takes
        half a minute to wind down on SIGTERM.)"""
        session = self.process.pid
        end_processes(lambda: session_processes(session), grace_s)
        self.process.wait(10)

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()
        if self.process is not None:
            stop_ray_head(self.process)
        for temp_dir in self._temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


class OperatorWithEnv(OperatorProcess):
    """The operator process with extra environment variables."""

    def __init__(self, *args, env: dict[str, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.env = env

    def start(self) -> "OperatorWithEnv":
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            return super().start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def ray_restartable():
    head = RestartableRay().start()
    try:
        yield head
    finally:
        head.cleanup()
