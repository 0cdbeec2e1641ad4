"""A trial's learning curve on its status, downsampled to a fixed number of points.

Every result goes to the results store; the Trial keeps a picture of the curve that
stays the same size whatever the number of results (issue 14: a Trial that kept every
result hit etcd's request limit at ~12,000 results).  A point is kept when at least
``stride`` iterations passed since the last kept one; when the curve holds more than
``CURVE_POINTS``, the stride doubles and the curve is thinned by the same rule.  So
the first ``CURVE_POINTS`` results are all there, and later the points stay evenly
spread.  Deterministic from (points, stride), both persisted, so a restarted operator
continues the very same curve.
"""
from __future__ import annotations

from typing import Any, Mapping

CURVE_POINTS = 64


def _iteration(point: Mapping[str, Any]) -> int:
    value = point.get("iteration", 0)
    return value if isinstance(value, int) else 0


def _thin(points: list[Mapping[str, Any]], stride: int) -> list[Mapping[str, Any]]:
    kept: list[Mapping[str, Any]] = []
    for point in points:
        if not kept or _iteration(point) >= _iteration(kept[-1]) + stride:
            kept.append(point)
    return kept


def add_point(points: list[Mapping[str, Any]], stride: int, point: Mapping[str, Any]) -> tuple[list, int]:
    """The curve and stride after one more result (``point`` carries ``iteration``)."""
    if points and _iteration(point) < _iteration(points[-1]) + stride:
        return points, stride
    points.append(point)
    while len(points) > CURVE_POINTS:
        stride *= 2
        points[:] = _thin(points, stride)
    return points, stride


def cut_back(points: list[Mapping[str, Any]], iteration: int) -> list[Mapping[str, Any]]:
    """The curve of a retry from a checkpoint at ``iteration``: later points are redone."""
    return [p for p in points if _iteration(p) <= iteration]
