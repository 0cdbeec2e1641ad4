"""The operator copies a reported checkpoint only from under the Experiment's own
storage prefix (checkpoints/storage.py ``confine``): a trial cannot make it copy
its ServiceAccount token, another team's prefix or bucket."""
from __future__ import annotations

import os

import pytest

from kubetune.checkpoints.storage import CheckpointOutsideStorage, clone_checkpoint, confine


def stored(root, relative: str) -> str:
    path = root / relative
    path.mkdir(parents=True)
    (path / "weights").write_text("w")
    return str(path)


def test_a_checkpoint_under_the_experiments_prefix_is_copied(tmp_path):
    storage = tmp_path / "store"
    donor = stored(storage, "ns/exp/exp-0/checkpoint-000002")
    copy = clone_checkpoint(donor, str(storage), "ns/exp/exp-3", 2)
    assert open(os.path.join(copy, "weights")).read() == "w"
    assert confine("file://" + donor, str(storage), "ns/exp") == donor


@pytest.mark.parametrize("reported, why", [
    ("{other}", "leaves the prefix"),                                   # another experiment's prefix
    ("{storage}/ns/exp/../other/exp-0/checkpoint-000001", "'..' segment"),
    ("{storage}/ns/exp", "leaves the prefix"),                          # the prefix itself
    ("/var/run/secrets/kubernetes.io/serviceaccount", "leaves the prefix"),
    ("s3://their-bucket/ns/exp/exp-0/checkpoint-000001", "a URI"),
    ("{link}", "leaves the prefix"),                                    # a symlink inside, pointing out
])
def test_a_location_outside_the_prefix_is_refused_and_nothing_is_copied(tmp_path, reported, why):
    storage = tmp_path / "store"
    stored(storage, "ns/exp/exp-0/checkpoint-000001")
    other = stored(storage, "ns/other/exp-0/checkpoint-000001")
    link = storage / "ns/exp/exp-1/checkpoint-000001"
    link.parent.mkdir(parents=True)
    link.symlink_to(other)
    location = reported.format(storage=storage, other=other, link=link)
    with pytest.raises(CheckpointOutsideStorage, match=why):
        clone_checkpoint(location, str(storage), "ns/exp/exp-3", 1)
    assert not (storage / "ns/exp/exp-3").exists()


@pytest.mark.parametrize("reported, allowed", [
    ("s3://bucket/kt/ns/exp/exp-0/checkpoint-000001", True),
    ("S3://bucket/kt/ns/exp/exp-0/checkpoint-000001", True),
    ("s3://other-bucket/kt/ns/exp/exp-0/checkpoint-000001", False),
    ("gs://bucket/kt/ns/exp/exp-0/checkpoint-000001", False),
    ("s3://bucket/kt/ns/expert/exp-0/checkpoint-000001", False),       # a prefix of the name is not the prefix
    ("s3://bucket/kt/ns/exp/../team-b/x/checkpoint-000001", False),
    ("s3://bucket/kt/ns/exp/exp-0/checkpoint-000001?versionId=1", False),
    ("/tmp/ns/exp/exp-0/checkpoint-000001", False),
])
def test_object_storage_locations_must_keep_the_scheme_bucket_and_prefix(reported, allowed):
    if allowed:
        assert confine(reported, "s3://bucket/kt", "ns/exp") == reported
    else:
        with pytest.raises(CheckpointOutsideStorage):
            confine(reported, "s3://bucket/kt", "ns/exp")


def test_a_checkpoint_swapped_for_a_symlink_after_the_check_is_not_followed(tmp_path, monkeypatch):
    """AUDIT N12: the pod flips its checkpoint directory to a symlink (to the operator's
    token directory) between ``confine``'s check and the copy.  The copy walks from the
    storage root with descriptors, following no link: it refuses, and copies nothing."""
    from kubetune.checkpoints import storage as checkpoint_storage
    storage = tmp_path / "store"
    donor = stored(storage, "ns/exp/exp-0/checkpoint-000002")
    secrets = tmp_path / "serviceaccount"
    secrets.mkdir()
    (secrets / "token").write_text("operator-token")
    checked = checkpoint_storage.confine

    def confine_then_swap(location, storage_, prefix):
        real = checked(location, storage_, prefix)     # the check passes on the real directory...
        os.rename(donor, donor + ".old")                # ...then the pod swaps it for a link
        os.symlink(secrets, donor)
        return real
    monkeypatch.setattr(checkpoint_storage, "confine", confine_then_swap)
    with pytest.raises(CheckpointOutsideStorage, match="symbolic link"):
        clone_checkpoint(donor, str(storage), "ns/exp/exp-3", 2)
    copied = [p for p in (storage / "ns/exp/exp-3").rglob("*") if p.is_file()]
    assert copied == []


def test_links_and_special_files_inside_a_checkpoint_are_refused(tmp_path):
    storage = tmp_path / "store"
    donor = stored(storage, "ns/exp/exp-0/checkpoint-000002")
    (tmp_path / "token").write_text("operator-token")
    os.symlink(tmp_path / "token", os.path.join(donor, "model.bin"))
    with pytest.raises(CheckpointOutsideStorage, match="model.bin is a symbolic link"):
        clone_checkpoint(donor, str(storage), "ns/exp/exp-3", 2)
    os.unlink(os.path.join(donor, "model.bin"))
    os.mkfifo(os.path.join(donor, "pipe"))             # would block a plain copy for ever
    with pytest.raises(CheckpointOutsideStorage, match="neither a regular file nor a directory"):
        clone_checkpoint(donor, str(storage), "ns/exp/exp-3", 2)
    assert not [p for p in (storage / "ns/exp/exp-3").iterdir()]


def test_a_parent_directory_swapped_for_a_link_does_not_redirect_the_copy(tmp_path):
    """The Experiment's own directory replaced by a link to another team's: the copy's
    destination and source are walked from the storage root, so neither leaves it."""
    storage = tmp_path / "store"
    donor = stored(storage, "ns/exp/exp-0/checkpoint-000002")
    elsewhere = tmp_path / "team-b"
    os.rename(storage / "ns" / "exp", elsewhere)
    os.symlink(elsewhere, storage / "ns" / "exp")
    with pytest.raises(CheckpointOutsideStorage):
        clone_checkpoint(donor, str(storage), "ns/exp/exp-3", 2)
    assert not (elsewhere / "exp-3").exists()
