"""PBT exploits get a copy of the donor's checkpoint of their own (no retention reaches it).

The runner (pure) says which live trial's checkpoint lies in another trial's storage
and takes the copy's location; checkpoints.storage.clone_checkpoint makes the copy.
The controller wiring is tested in tests/integration/test_pbt_checkpoints.py."""
from __future__ import annotations

import os

import pytest

from kubetune.core.types import LaunchTrial, PauseTrial, Result
from kubetune.checkpoints.storage import (CheckpointError, CheckpointStore, clone_checkpoint,
                                           clone_checkpoint_or_newer, materialize)
from unit_helpers import make_runner, make_spec, of_type


def exploit(runner):
    """exp-3 (worst) exploits exp-0 (best) at iteration 2."""
    runner.step(0.0)
    out = []
    for seq, iteration in enumerate((1, 2)):
        for name, loss in {"exp-0": 0.1, "exp-1": 0.2, "exp-2": 0.3, "exp-3": 0.9}.items():
            location = f"/store/ns/exp/{name}/checkpoint-{iteration:06d}"
            out += runner.on_trial_result(name, Result(seq, iteration, {"loss": loss}, 1.0, location, 0), 1.0)
    return out


def test_the_runner_names_the_exploit_and_its_borrowed_checkpoint():
    spec = make_spec(scheduler={"type": "pbt", "maxIterations": 50, "perturbationInterval": 2},
                     budget={"maxTrials": 4, "parallelism": 4})
    runner = make_runner(spec, owner="ns/exp/")
    out = exploit(runner)
    [pause] = of_type(out, PauseTrial)
    assert pause.name == "exp-3" and pause.clone_from == "exp-0"
    donor_checkpoint = "/store/ns/exp/exp-0/checkpoint-000002"
    assert runner.borrowed_checkpoint("exp-3") == donor_checkpoint
    assert [runner.borrowed_checkpoint(n) for n in ("exp-0", "exp-1", "exp-2")] == [None] * 3   # their own

    own = "/store/ns/exp/exp-3/exploit-000002"
    assert not runner.on_checkpoint_cloned("exp-3", "/somewhere/else", own)    # not what it continues from
    assert runner.on_checkpoint_cloned("exp-3", donor_checkpoint, own)
    assert runner.trials["exp-3"].checkpoint == own and runner.borrowed_checkpoint("exp-3") is None
    # a retry of the exploiting trial continues from its own copy
    runner.on_trial_launched("exp-3", 1.0)
    runner.on_trial_errored("exp-3", "node lost", 2.0, cluster_fault=True)   # relaunched by the next step
    retry = [d for d in of_type(runner.step(3.0), LaunchTrial) if d.name == "exp-3"]
    assert [d.checkpoint for d in retry] == [own]


def test_a_retention_pause_is_not_a_clone():
    spec = make_spec(scheduler={"type": "asha", "maxIterations": 9}, budget={"maxTrials": 1})
    runner = make_runner(spec)
    runner.step(0.0)
    assert runner.borrowed_checkpoint("exp-0") is None


def test_clone_copies_into_the_trials_own_directory_out_of_retentions_reach(tmp_path):
    storage = str(tmp_path / "store")
    donor = CheckpointStore(storage, "ns/exp/exp-0", keep_last=1)
    source_dir = tmp_path / "weights"
    source_dir.mkdir()
    (source_dir / "w.txt").write_text("donor at 2")
    location = donor.persist(source_dir, 2, {"loss": 0.1})

    copy = clone_checkpoint(location, storage, "ns/exp/exp-3", 2)
    assert copy == os.path.join(storage, "ns", "exp", "exp-3", "exploit-000002")
    (source_dir / "w.txt").write_text("donor at 3")
    donor.persist(source_dir, 3, {"loss": 0.05})              # keepLast 1: the donor's iteration 2 goes
    assert not os.path.exists(location)
    # the recipient's own retention (it runs on from the copy) leaves the copy alone
    recipient = CheckpointStore(storage, "ns/exp/exp-3", keep_last=1)
    for iteration in (3, 4):
        recipient.persist(source_dir, iteration, {"loss": 0.2})
    recipient.trim()
    with open(os.path.join(materialize(copy), "w.txt")) as f:
        assert f.read() == "donor at 2"

    # the next exploit replaces the earlier copy; a vanished source is an error
    again = clone_checkpoint(recipient.list()[-1].location, storage, "ns/exp/exp-1", 4)
    newer = clone_checkpoint(again, storage, "ns/exp/exp-3", 4)
    assert os.path.isdir(newer) and not os.path.exists(copy)
    with pytest.raises(CheckpointError, match="does not exist"):
        clone_checkpoint(location, storage, "ns/exp/exp-3", 2)


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_donor_checkpoint_already_deleted_is_replaced_by_the_donors_newest(tmp_path, scheme):
    # a pod donor keeps only its keepLast newest, whatever the operator has seen: by the
    # time of the copy, the checkpoint the exploit chose may be gone
    storage = scheme + str(tmp_path / "store")
    donor = CheckpointStore(storage, "ns/exp/exp-0", keep_last=1)
    weights = tmp_path / "weights"
    weights.mkdir()
    chosen = None
    for iteration in (2, 3, 4):
        (weights / "w.txt").write_text(f"donor at {iteration}")
        location = donor.persist(weights, iteration, {"loss": 1.0 / iteration})
        chosen = chosen or location
    assert not os.path.exists(chosen)
    copy = clone_checkpoint_or_newer(chosen, storage, "ns/exp/exp-3", 2)
    with open(os.path.join(materialize(copy), "w.txt")) as f:
        assert f.read() == "donor at 4"
    # anything else that cannot be copied is still an error
    with pytest.raises(CheckpointError):
        clone_checkpoint_or_newer(str(tmp_path / "elsewhere" / "checkpoint-000001"), storage, "ns/exp/exp-3", 2)
