"""The operator's client-side rate limit (issue 26, k8s/rate_limit.py): a token bucket as
client-go's QPS and Burst, and its settings."""
from __future__ import annotations

import pytest

from kubetune import cli
from kubetune.k8s.rate_limit import TokenBucket
from kubetune.settings import SettingError, from_args


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_goes_at_once_and_the_rest_at_qps_in_order():
    clock = Clock()
    bucket = TokenBucket(qps=2.0, burst=3, clock=clock)
    assert [bucket.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [bucket.delay() for _ in range(3)] == [0.5, 1.0, 1.5]   # each waiter its own slot
    assert bucket.waited == 3
    clock.now += 10.0                                                 # idle: the bucket refills, to burst only
    assert [bucket.delay() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


def test_over_a_long_run_the_rate_is_qps():
    clock = Clock()
    bucket = TokenBucket(qps=50.0, burst=100, clock=clock)
    sent = 0
    for _ in range(1000):                    # 10 s of 100 requests a second asked
        for _ in range(10):
            if bucket.delay() == 0.0:
                sent += 1
            else:
                bucket._tokens += 1.0        # refused here: not queued (counts only what went at once)
        clock.now += 0.1
    assert 100 + 50 * 100 - 10 <= sent <= 100 + 50 * 100 + 10


def _settings(*argv: str):
    return from_args(cli.build_parser().parse_args(["operator", *argv]))


def test_qps_and_burst_are_operator_settings():
    assert (_settings().kube_api_qps, _settings().kube_api_burst) == (50.0, 100)
    chosen = _settings("--kube-api-qps=5", "--kube-api-burst=10")
    assert (chosen.kube_api_qps, chosen.kube_api_burst) == (5.0, 10)
    with pytest.raises(SettingError, match="--kube-api-qps: '0' is not a number of requests a second"):
        _settings("--kube-api-qps=0")
    with pytest.raises(SettingError, match="--kube-api-burst: 'x' is not a whole number"):
        _settings("--kube-api-burst=x")
