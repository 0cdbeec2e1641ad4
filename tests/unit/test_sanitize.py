"""Every write to the API server is valid JSON and bounded whatever a trial reports
(core/sanitize.py); a refused write is retried with backoff and surfaced
(controller/write_failures.py)."""
from __future__ import annotations

import json
import math

import pytest

from kubetune.k8s.errors import WriteRefused
from kubetune.controller.write_failures import WriteFailures
from kubetune.core.sanitize import cap_text, decode_number, fit, json_safe, json_size


def test_non_finite_numbers_and_huge_integers_take_their_documented_string_form():
    value = {"a": math.nan, "b": [math.inf, -math.inf, 2 ** 70, -(2 ** 63)], "c": {"d": 1.5, "e": None}}
    safe = json_safe(value)
    assert safe == {"a": "NaN", "b": ["Infinity", "-Infinity", str(2 ** 70), -(2 ** 63)], "c": {"d": 1.5, "e": None}}
    json.dumps(safe, allow_nan=False)
    assert math.isnan(decode_number("NaN")) and decode_number("-Infinity") == -math.inf
    assert decode_number("warmup") == "warmup"


def test_messages_are_cut_to_1_kib_of_utf8_keeping_the_start():
    text = "ValueError: ü" + "x" * 5000
    capped = cap_text(text)
    assert len(capped.encode()) <= 1024 and capped.startswith("ValueError: ü")


@pytest.mark.parametrize("shape", ["long list", "long strings", "deep", "many keys"])
def test_fit_bounds_anything(shape):
    value = {"long list": {"h": [{"i": i, "x": "y" * 50} for i in range(10_000)]},
             "long strings": {"m": "z" * 200_000, "n": ["q" * 90_000] * 3},
             "deep": {"a": [[[[[[[["w" * 100_000]]]]]]]]},
             "many keys": {f"k{i}": i for i in range(20_000)}}[shape]
    bounded = fit(json_safe(value), 16 * 1024)
    assert json_size(bounded) <= 16 * 1024


def test_a_refused_write_backs_off_and_is_surfaced_after_three_failures_in_a_row():
    failures = WriteFailures()
    throttled = WriteRefused(429, "TooManyRequests", "slow down")
    assert not failures.failed("Trial t-1", throttled, now=0.0)
    assert not failures.ready("Trial t-1", 0.1) and failures.ready("Trial t-2", 0.1) and failures.ready("Trial t-1", 0.6)
    assert not failures.failed("Trial t-1", throttled, now=1.0) and failures.condition() is None
    assert failures.failed("Trial t-1", throttled, now=3.0)            # third in a row: one Event
    reason, message = failures.condition()
    assert reason == "TooManyRequests" and "Trial t-1" in message and "429" in message
    assert not failures.failed("Trial t-1", throttled, now=10.0)        # not again
    assert not failures.hopeless("Trial t-1")        # 429 may pass next time: a finish waits for it
    failures.succeeded("Trial t-1")
    assert failures.condition() is None


def test_a_refusal_retrying_will_not_cure_is_surfaced_at_once():
    failures = WriteFailures()
    assert failures.failed("Experiment", WriteRefused(422, "Invalid", "status.x: bad"), now=0.0)
    assert failures.hopeless("Experiment")
    assert failures.condition() == ("Invalid", "Experiment: the API server refused the status write 1 times: "
                                               "422 Invalid: status.x: bad; retrying with backoff")
