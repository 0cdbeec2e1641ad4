"""Checkpoints on the trial side (issue 6): retention keeps what the operator knows of,
and another trial's checkpoint (PBT) is copied as the trial starts."""
from __future__ import annotations

import os
import shutil
import threading

import kubetune
from kubetune.trainable.function_runner import FunctionRunner


def stored(root, key: str = "ns/exp/exp-0") -> list[int]:
    trial_dir = root / key
    return sorted(int(n.rsplit("-", 1)[1]) for n in os.listdir(trial_dir) if n.startswith("checkpoint-"))


def test_retention_keeps_the_checkpoints_the_operator_fetched_until_it_fetched_past_them(tmp_path):
    go = [threading.Event() for _ in range(4)]
    reported = [threading.Event() for _ in range(4)]
    source = tmp_path / "work"
    source.mkdir()

    def train(config):
        for phase, count in enumerate((3, 3, 1, 1)):
            go[phase].wait(10)
            for _ in range(count):
                kubetune.report({"loss": 1.0}, checkpoint=str(source))
            reported[phase].set()

    def run_phase(phase: int) -> list[int]:
        go[phase].set()
        assert reported[phase].wait(10)
        return stored(storage)

    storage = tmp_path / "storage"
    runner = FunctionRunner(train, trial_key="ns/exp/exp-0", config={}, storage=str(storage), keep_last=2)
    runner.start()
    assert run_phase(0) == [2, 3]         # keepLast 2
    runner.fetch(0)                       # the operator now holds 1..3 and may use any of them
    assert run_phase(1) == [2, 3, 5, 6]
    runner.fetch(3)                       # it recorded 1..3 (its checkpoint: 3) and got 4..6
    assert run_phase(2) == [3, 5, 6, 7]
    runner.fetch(7)                       # it recorded everything: only the latest two remain
    assert run_phase(3) == [7, 8]
    assert runner.join(10)


def test_another_trials_checkpoint_is_copied_when_the_trial_starts(tmp_path):
    donor = tmp_path / "storage" / "ns" / "exp" / "exp-1" / "checkpoint-000004"
    donor.mkdir(parents=True)
    (donor / "state.json").write_text('{"i": 4}')
    seen = []
    started = threading.Event()

    def train(config):
        started.wait(10)
        seen.append(open(os.path.join(kubetune.get_checkpoint(), "state.json")).read())

    runner = FunctionRunner(train, trial_key="ns/exp/exp-0", config={}, checkpoint=str(donor),
                            start_iteration=4, storage=str(tmp_path / "storage"))
    runner.start()
    shutil.rmtree(donor)                  # the donor's retention moves on
    started.set()
    assert runner.join(10) and runner.state == "completed" and seen == ['{"i": 4}']


def test_an_ended_trial_keeps_only_its_latest_checkpoints(tmp_path):
    fetched = threading.Event()
    source = tmp_path / "work"
    source.mkdir()

    def train(config):
        for i in range(5):
            if i == 2:
                fetched.wait(10)
            kubetune.report({"loss": 1.0}, checkpoint=str(source))

    storage = tmp_path / "storage"
    runner = FunctionRunner(train, trial_key="ns/exp/exp-0", config={}, storage=str(storage), keep_last=2)
    runner.start()
    while runner.last_seq < 2:
        runner.join(0.01)
    runner.fetch(0)
    fetched.set()
    assert runner.join(10)
    assert stored(storage) == [1, 2, 4, 5]      # 1 and 2 were handed to the operator
    runner.trim_checkpoints()                   # the operator has it all: the trial is released
    assert stored(storage) == [4, 5]
