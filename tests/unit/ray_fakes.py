"""A stand-in for a Ray cluster's executor in unit tests of the Ray platform: every method
of ``RayConnection`` (executors/ray/connection.py) with a neutral answer, for a test to
override what it scripts.  tests/unit/test_ray_connection.py keeps it complete."""
from __future__ import annotations

from typing import Mapping

from kubetune.executors.base import ClusterResources, LaunchInfo, LaunchRequest, TrialUpdate


class FakeRayConnection:
    def connect(self) -> None:
        pass

    def disconnect(self) -> None:
        pass

    def close(self) -> None:
        pass

    def is_unavailable(self, error: BaseException) -> bool:
        return isinstance(error, ConnectionError)

    def gcs_endpoint(self) -> tuple[str, int] | None:
        return None

    def start(self, req: LaunchRequest) -> LaunchInfo:
        return LaunchInfo(req.trial_key, f"fake/{req.trial_key}", attached=False)

    def poll(self, cursors: Mapping[str, int], *, wait_s: float = 0.0, limit: int = 1000) -> dict[str, TrialUpdate]:
        return {}

    def stop(self, trial_key: str, *, after_seq: int | None = None, timeout_s: float = 5.0) -> TrialUpdate | None:
        return None

    def pause(self, trial_key: str, *, after_seq: int | None = None, timeout_s: float = 30.0) -> TrialUpdate | None:
        return None

    def list_trials(self, prefix: str = "") -> list[str]:
        return []

    def stop_all(self, prefix: str) -> int:
        return 0

    def remaining(self, prefix: str) -> int:
        return 0

    def cluster_resources(self) -> ClusterResources:
        return ClusterResources({}, {}, [])

    def node_types(self):
        return None

    def request_resources(self, bundles: list[dict[str, float]]) -> None:
        pass

    def logs(self, trial_key: str, lines: int = 200) -> str:
        return ""

    def describe(self, trial_key: str) -> dict | None:
        return None
