"""dashboard/snapshot.py: a study's page data on disk, read back only for the same state
and versions, never half a file, and the directory kept under its size."""
from __future__ import annotations

import os

from kubetune.dashboard.snapshot import Snapshots

ORDERED, BEST, REST = [b'{"number": 0}', b'{"number": 1}', b""], [b'{"number": 1}'], b'"name": "a/b"}'


def test_the_pieces_come_back_for_the_state_they_were_kept_for(tmp_path):
    snapshots = Snapshots(tmp_path, "sqlite:///a.db", 1 << 20)
    assert snapshots.load(7, "key") is None
    assert snapshots.save(7, "key", ORDERED, BEST, REST)
    assert snapshots.load(7, "key") == (ORDERED, BEST, REST)
    assert snapshots.load(7, "another state") is None
    assert Snapshots(tmp_path, "sqlite:///b.db", 1 << 20).load(7, "key") is None   # another store
    snapshots.forget(7)
    assert snapshots.load(7, "key") is None


def test_a_file_not_as_written_is_ignored(tmp_path):
    snapshots = Snapshots(tmp_path, "store", 1 << 20)
    snapshots.save(1, "key", ORDERED, BEST, REST)
    [path] = tmp_path.glob("*.study")
    data = path.read_bytes()
    path.write_bytes(data[:-3])                                   # cut short
    assert snapshots.load(1, "key") is None
    path.write_bytes(b"not json\n" + data)
    assert snapshots.load(1, "key") is None
    path.write_bytes(data.replace(b'"ordered": [13, 13, 0]', b'"ordered": [13, -13, 26]'))
    assert snapshots.load(1, "key") is None
    snapshots._versions = {**snapshots._versions, "optuna-dashboard": "9.9"}   # written by another version
    path.write_bytes(data)
    assert snapshots.load(1, "key") is None


def test_the_oldest_files_go_when_the_directory_is_full(tmp_path):
    size = len(ORDERED[0]) * 100
    snapshots = Snapshots(tmp_path, "store", int(size * 2.5))
    piece = [b"x" * size]
    for study_id in (1, 2):
        assert snapshots.save(study_id, "key", piece, [], b"")
        path = next(tmp_path.glob(f"*-{study_id}.study"))
        os.utime(path, (study_id, study_id))                      # 1 is the older
    assert snapshots.save(3, "key", piece, [], b"")
    assert snapshots.load(1, "key") is None
    assert snapshots.load(2, "key") is not None and snapshots.load(3, "key") is not None
    assert not snapshots.save(4, "key", [b"x" * size * 3], [], b"")   # alone over the limit: not kept
    assert not list(tmp_path.glob("*.tmp"))


def test_a_temporary_file_a_killed_dashboard_left_is_removed_at_start(tmp_path):
    left, writing = tmp_path / "a.tmp", tmp_path / "b.tmp"   # b: another dashboard writing now
    for path in (left, writing):
        path.write_bytes(b"half a page")
    os.utime(left, (1, 1))
    Snapshots(tmp_path, "store", 1 << 20)
    assert not left.exists() and writing.exists()
