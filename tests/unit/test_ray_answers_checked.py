"""A fresh trial's answers pass the checks of executors/ray/checked.py: its runner starts
at last_seq -1 and numbers its first result 0 (core/trial.py: TrialInfo.last_seq = -1 is
what the launch passes as start_seq). Found by the README's five-minute path
(tests/integration/test_docs.py): every trial of `kubetune run` was rejected."""
import json

import pytest

from kubetune.executors.ray import checked
from kubetune.executors.ray.answers import AnswerError
from kubetune.trainable.function_runner import FunctionRunner

KEY = "local/exp/exp-0"


def train(config):
    import kubetune
    for step in range(3):
        kubetune.report({"loss": 1.0 / (step + 1)})


def test_what_a_fresh_trials_runner_answers_is_accepted():
    runner = FunctionRunner(train, trial_key=KEY, config={}, start_seq=-1)
    before = json.loads(json.dumps(runner.fetch(-1)))          # as it crosses: JSON
    assert checked.batch(before, KEY, limit=10)["state"] in ("running", "completed")
    runner.start()
    assert runner.join(timeout=30)
    answer = checked.batch(json.loads(json.dumps(runner.fetch(-1))), KEY, limit=10)
    assert [r["seq"] for r in answer["results"]] == [0, 1, 2] and answer["state"] == "completed"


@pytest.mark.parametrize("field,value", [("seq", -1), ("seq", "0"), ("last_seq", -2)])
def test_what_no_runner_sends_is_still_refused(field, value):
    result = {"seq": 0, "iteration": 1, "metrics": {"loss": 0.5}, "timestamp": 1.0}
    answer = {"state": "running", "results": [result], "last_seq": 0}
    if field == "seq":
        result["seq"] = value
    else:
        answer["last_seq"] = value
    with pytest.raises(AnswerError):
        checked.batch(answer, KEY, limit=10)


def test_a_fresh_hosts_description_and_a_runs_times_pass_the_checks():
    from kubetune.trainable.host import TrialHost
    host = TrialHost("worker", capture_output=False)
    assert checked.description(json.loads(json.dumps(host._describe_locked())))["last_seq"] in (None, -1)
    runner = FunctionRunner(train, trial_key=KEY, config={}, start_seq=-1)
    runner.start()
    assert runner.join(timeout=30)
    answer = checked.batch(json.loads(json.dumps(runner.fetch(-1))), KEY, limit=10)
    assert 0 < answer["started_at"] <= answer["ended_at"]          # what the usage ledger counts
    with pytest.raises(AnswerError):
        checked.batch({**json.loads(json.dumps(runner.fetch(-1))), "ended_at": "soon"}, KEY, limit=10)
