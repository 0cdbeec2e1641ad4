"""What a ``RayPlatform`` (platform.py) calls on its executor: the ``TrialExecutor``
protocol and what a Ray cluster adds to it.

Two classes implement it: ``RayExecutor`` (executor.py: this process's Ray driver) and
``DriverProcess`` (process.py: a Ray driver in a child process, for another cluster).
The platform holds a ``RayConnection`` and calls these methods, never ``getattr``: a
method missing from either class fails tests/unit/test_ray_connection.py, which reads
both against this protocol.  Imports no Ray: platform.py must load where Ray is absent."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from kubetune.core.resources import Resources
from kubetune.executors.base import TrialExecutor


@runtime_checkable
class RayConnection(TrialExecutor, Protocol):
    """A ``TrialExecutor`` connected to one Ray cluster."""

    def gcs_endpoint(self) -> tuple[str, int] | None:
        """The cluster's GCS host and port, which the platform probes while a call is stuck
        (outage.py); None when there is nothing to probe (``local``, Ray Client, not
        connected, or a driver process, which bounds its own calls)."""

    def node_types(self) -> list[Resources] | None:
        """The largest shape of each node type the autoscaler may add; None when the
        cluster cannot grow."""

    def remaining(self, prefix: str) -> int:
        """How many actors under a trial-key prefix are still alive."""

    def close(self) -> None:
        """End the connection and whatever serves it (a driver process: the process);
        trials keep running (unless Ray was embedded: ``local``)."""
