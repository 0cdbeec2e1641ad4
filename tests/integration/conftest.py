"""Integration fixtures: a real control plane (kube_fixtures) and real Ray (ray_fixtures)."""
from kube_fixtures import *  # noqa: F401,F403  (pytest discovers fixtures by name)
from ray_fixtures import *  # noqa: F401,F403
