"""The pods platform's one reader of Kubernetes timestamps (executors/pods/times.py), used
for a pod's run times, its scheduling wait and a Workload's admission."""
from __future__ import annotations

import calendar

import pytest

from kubetune.executors.pods import kueue, spec
from kubetune.executors.pods.times import epoch_of

NEW_YEAR = calendar.timegm((2026, 1, 1, 0, 0, 0, 0, 0, 0))


@pytest.mark.parametrize("text, seconds", [
    ("2026-01-01T00:00:42Z", NEW_YEAR + 42),              # Time
    ("2026-01-01T00:00:42.250000Z", NEW_YEAR + 42.25),    # MicroTime
])
def test_kubernetes_timestamps_are_read(text, seconds):
    assert epoch_of(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "yesterday", "2026-01-01 00:00:42", "2026-01-01T00:00:42+02:00"])
def test_what_kubernetes_does_not_write_is_none_not_an_error(text):
    assert epoch_of(text) is None


def test_run_times_and_scheduling_wait_read_the_same_way():
    pod = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
           "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                      "lastTransitionTime": "2026-01-01T00:00:07Z"}],
                      "containerStatuses": [{"state": {"terminated": {"startedAt": "2026-01-01T00:00:09Z",
                                                                      "finishedAt": "2026-01-01T00:01:09Z"}}}]}}
    assert kueue.queue_wait(pod) == 7.0
    assert spec.run_times(pod) == (NEW_YEAR + 9, NEW_YEAR + 69)
