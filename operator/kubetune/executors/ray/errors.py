"""Which errors of a Ray call mean "the cluster cannot be reached", so the controller
marks the cluster unavailable and reconnects instead of failing a trial.  The
controller asks this through ``RayExecutor.is_unavailable`` and never imports Ray."""
from __future__ import annotations

from ray.exceptions import GetTimeoutError, RaySystemError

from kubetune.executors.base import RayUnavailableError

# gRPC's error from the GCS client; its class moves between Ray's private modules
_BY_NAME = {"RpcError"}


def is_unavailable(error: BaseException) -> bool:
    return isinstance(error, (RayUnavailableError, ConnectionError, RaySystemError, GetTimeoutError)) \
        or type(error).__name__ in _BY_NAME
