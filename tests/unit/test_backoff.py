"""core/backoff.py: the waits double from the first up to the maximum, a success starts over,
and a failure seen elsewhere holds off the current step without lengthening the next."""
from kubetune.core.backoff import Backoff, exponential


def test_the_waits_double_up_to_the_maximum():
    assert [exponential(n, 0.5, 30.0) for n in range(1, 10)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_a_failure_streak_of_days_stays_at_the_maximum():
    assert exponential(2000, 0.5, 30.0) == 30.0          # 2 ** 1999 would overflow a float
    retry = Backoff(first_s=1.0, max_s=30.0)
    for now in range(0, 30 * 3000, 30):                  # 25 hours of failing every 30 s
        assert retry.failed(float(now)) <= 30.0
    assert retry.retry_at == 30 * 2999 + 30.0


def test_an_attempt_is_due_only_once_its_wait_is_over_and_a_success_starts_over():
    retry = Backoff(first_s=1.0, max_s=4.0)
    assert retry.due(0.0)
    assert [retry.failed(now) for now in (0.0, 1.0, 3.0, 7.0)] == [1.0, 2.0, 4.0, 4.0]
    assert not retry.due(10.9) and retry.due(11.0)
    retry.reset()
    assert retry.due(0.0) and retry.failed(20.0) == 1.0 and not retry.due(20.5)


def test_a_hold_waits_the_current_step_and_does_not_count_a_failure():
    retry = Backoff(first_s=1.0, max_s=30.0)
    retry.hold(5.0)                         # lost the cluster on a healthy connection
    assert not retry.due(5.5) and retry.due(6.0)
    retry.failed(6.0)
    retry.failed(7.0)                       # two failures: the step is 2 s
    retry.hold(10.0)
    assert not retry.due(11.9) and retry.due(12.0)
    assert retry.failed(12.0) == 4.0        # the hold did not lengthen the steps after it
