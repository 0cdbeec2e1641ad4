"""Integration fixtures: a real control plane (kube_fixtures), real Ray
(ray_fixtures) and the operator process (operator_fixtures)."""
from autoscaler_fixtures import *  # noqa: F401,F403
from kube_fixtures import *  # noqa: F401,F403  (pytest discovers fixtures by name)
from operator_fixtures import *  # noqa: F401,F403
from pod_fixtures import *  # noqa: F401,F403
from ray_fixtures import *  # noqa: F401,F403
from recovery_fixtures import *  # noqa: F401,F403
