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
