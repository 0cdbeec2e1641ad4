"""Kubernetes' timestamps as seconds since the epoch, for the pods platform's readers
(pod start and end times, a Workload's admission, a pod's scheduling)."""
from __future__ import annotations

import calendar
import re

# Kubernetes writes times as RFC 3339 in UTC ("2026-01-01T00:00:42Z", microseconds in
# MicroTime); parsed by hand, as the rest of this platform's parsing: pure, no datetime
_RFC3339_UTC = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?Z$")


def epoch_of(timestamp: str | None) -> float | None:
    """``timestamp`` in seconds since the epoch; None if absent or not one Kubernetes writes."""
    match = _RFC3339_UTC.match(timestamp or "")
    if match is None:
        return None
    *fields, fraction = match.groups()
    return calendar.timegm(tuple(int(f) for f in fields) + (0, 0, 0)) + float(fraction or 0)
