"""What a trial actor's answer may hold (executors/ray/checked.py, issue 25 N1): what
the operator's own launches produce passes, anything else is rejected naming the field."""
from __future__ import annotations

import json

import pytest

from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError, decode
from kubetune.trainable.function_runner import FunctionRunner

KEY = "ns/exp/exp-0"


def _report_twice(config):
    import kubetune
    kubetune.report({"loss": 1.0})
    kubetune.report({"loss": 0.5, "tag": "nul\0"})


@pytest.mark.parametrize("start_seq", [-1, 0, 41])
def test_a_runners_own_answer_passes_from_every_start_the_operator_uses(start_seq):
    # the operator launches a fresh trial with start_seq -1: its first result is seq 0
    runner = FunctionRunner(_report_twice, trial_key=KEY, config={}, start_seq=start_seq)
    runner.start()
    assert runner.join(30)
    batch = checked.batch(decode(json.dumps(runner.fetch(start_seq)).encode()), KEY, limit=1000)
    assert [r["seq"] for r in batch["results"]] == [start_seq + 1, start_seq + 2]
    assert batch["state"] == "completed" and batch["last_seq"] == start_seq + 2


@pytest.mark.parametrize("change,field", [
    ({"state": "pwned"}, "state"), ({"results": "x"}, "results"), ({"last_seq": -2}, "last_seq"),
    ({"results": [{"seq": -1, "iteration": 1, "metrics": {}}]}, "results[0].seq"),
    ({"results": [{"seq": 1, "iteration": 1, "metrics": {"a": [1]}}]}, "results[0]"),
    ({"checkpoint": "/ckpt/other/exp/exp-9/checkpoint-1"}, "checkpoint"),
    ({"error": 7}, "error"),
])
def test_anything_else_is_rejected_naming_the_field(change, field):
    answer = {"state": "running", "results": [], "error": "", "last_seq": 0, **change}
    with pytest.raises(AnswerError) as rejected:
        checked.batch(answer, KEY, limit=1000)
    assert rejected.value.kind == "rejected" and f" {field} " in str(rejected.value)


def test_an_answer_that_is_not_bounded_json_is_rejected():
    for raw in (b"\x80\x04pickle", b"[" * 100_000 + b"]" * 100_000, b'{"kubetune-invalid-answer": "TypeError"}'):
        with pytest.raises(AnswerError) as rejected:
            decode(raw)
        assert rejected.value.kind == "rejected"
