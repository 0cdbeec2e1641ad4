"""Checkpoint storage: layout, retention, restore; local paths and fsspec URIs."""
from __future__ import annotations

import os
import uuid

import fsspec
import pytest

import kubetune
from kubetune.checkpoints.storage import (CheckpointError, CheckpointStore,
                                           delete_trial_checkpoints, materialize)
from kubetune.trainable.function_runner import FAILED, FunctionRunner


def make_dir(root, name: str, payload: str):
    path = root / name
    path.mkdir()
    (path / "weights.txt").write_text(payload)
    return path


def test_layout_and_keep_last(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"), "ns/exp/exp-3", keep_last=2)
    for i in (1, 2, 3):
        location = store.persist(make_dir(tmp_path, f"src{i}", f"w{i}"), i, {"loss": 1.0 / i})
    assert location == str(tmp_path / "store" / "ns" / "exp" / "exp-3" / "checkpoint-000003")
    assert [c.iteration for c in store.list()] == [2, 3]
    assert sorted(os.listdir(tmp_path / "store/ns/exp/exp-3")) == [
        "checkpoint-000002", "checkpoint-000003"]
    assert store.list()[-1].metrics == {"loss": pytest.approx(1 / 3)}


def test_keep_best_keeps_the_best_by_the_objective(tmp_path):
    store = CheckpointStore(str(tmp_path), "ns/exp/t", keep_last=1, keep_best=1,
                            metric="loss", mode="min")
    for i, loss in enumerate([0.5, 0.1, 0.7, 0.9], start=1):
        store.persist(make_dir(tmp_path, f"s{i}", str(i)), i, {"loss": loss})
    assert [c.iteration for c in store.list()] == [2, 4]


def test_materialize_returns_a_private_copy(tmp_path):
    store = CheckpointStore(str(tmp_path / "s"), "ns/exp/t")
    location = store.persist(make_dir(tmp_path, "src", "hello"), 4, {})
    copy = materialize(location)
    assert open(os.path.join(copy, "weights.txt")).read() == "hello"
    assert os.listdir(copy) == ["weights.txt"]
    assert not copy.startswith(str(tmp_path / "s"))
    with pytest.raises(CheckpointError, match="does not exist"):
        materialize(str(tmp_path / "nowhere"))


def test_fsspec_uri_storage_round_trip(tmp_path):
    root = f"memory://kubetune-test-{uuid.uuid4().hex[:6]}"
    store = CheckpointStore(root, "ns/exp/t", keep_last=1)
    store.persist(make_dir(tmp_path, "a", "one"), 1, {})
    location = store.persist(make_dir(tmp_path, "b", "two"), 2, {})
    assert location == f"{root}/ns/exp/t/checkpoint-000002"
    assert [c.iteration for c in store.list()] == [2]
    copy = materialize(location)
    assert open(os.path.join(copy, "weights.txt")).read() == "two"
    delete_trial_checkpoints(root, "ns/exp/t")
    assert not fsspec.filesystem("memory").exists(f"{root}/ns/exp/t".removeprefix("memory://"))


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(CheckpointError, match="nosuchfs://bucket"):
        CheckpointStore("nosuchfs://bucket/x", "ns/exp/t")


def test_report_persists_and_a_relaunch_gets_it_back(tmp_path):
    storage = str(tmp_path / "store")

    def first(config):
        for i in (1, 2, 3):
            kubetune.report({"i": i}, checkpoint=make_dir(tmp_path, f"c{i}", f"state{i}"))

    runner = FunctionRunner(first, trial_key="ns/exp/t", config={}, storage=storage, keep_last=2)
    runner.start()
    assert runner.join(10)
    results = runner.fetch(0)["results"]
    latest = results[-1]["checkpoint"]
    assert latest == os.path.join(storage, "ns/exp/t/checkpoint-000003")
    assert sorted(os.listdir(os.path.join(storage, "ns/exp/t"))) == [
        "checkpoint-000002", "checkpoint-000003"]

    seen = []

    def resumed(config):
        seen.append(open(os.path.join(kubetune.get_checkpoint(), "weights.txt")).read())
        kubetune.report({"i": 4})

    again = FunctionRunner(resumed, trial_key="ns/exp/t", config={}, checkpoint=latest,
                           start_iteration=3, start_seq=3, attempt=1, storage=storage)
    again.start()
    assert again.join(10)
    assert seen == ["state3"]
    assert [(r["seq"], r["iteration"]) for r in again.fetch(3)["results"]] == [(4, 4)]


def test_checkpoint_without_storage_fails_the_trial(tmp_path):
    def train(config):
        kubetune.report({"i": 1}, checkpoint=make_dir(tmp_path, "c", "x"))

    runner = FunctionRunner(train, trial_key="ns/exp/t", config={})
    runner.start()
    assert runner.join(10)
    batch = runner.fetch(0)
    assert batch["state"] == FAILED
    assert "no checkpoint storage configured" in batch["error"]
