"""Which errors of a Ray call mean "the cluster cannot be reached", so the controller
marks the cluster unavailable and reconnects instead of failing a trial.  The
controller asks this through its ``Platform`` (``classify``) and never imports Ray.

Ray itself is imported lazily: a driver process's parent (executors/ray/process.py)
raises ``RayUnavailableError`` without importing Ray."""
from __future__ import annotations

from kubetune.executors.base import PlatformUnavailableError
from kubetune.executors.ray.ray_compat import RPC_ERROR_NAMES


class RayUnavailableError(PlatformUnavailableError):
    """The Ray cluster cannot be reached; ``address`` and ``cause`` say which and why."""

    def __init__(self, address: str, cause: str):
        super().__init__(address, cause, f"Ray at {address!r} is unavailable: {cause}")


# In what Ray's GCS client raises for a call that waited out an outage and was answered by
# another cluster at the same address (the head restarted): the cluster called is gone.
CLUSTER_RESTARTED = "WrongClusterID"


def is_unavailable(error: BaseException) -> bool:
    from ray.exceptions import GetTimeoutError, RaySystemError
    return isinstance(error, (PlatformUnavailableError, ConnectionError, RaySystemError, GetTimeoutError)) \
        or type(error).__name__ in RPC_ERROR_NAMES or CLUSTER_RESTARTED in str(error)
