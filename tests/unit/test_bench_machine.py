"""The commit a benchmark figure is reported with says when the code differed from it."""
from __future__ import annotations

import subprocess

from kubetune.bench.machine import commit_label, git_state


def _git(repo, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_a_clean_checkout_is_its_commit_and_a_changed_one_says_dirty(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "f.txt").write_text("one\n")
    _git(tmp_path, "add", "f.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "--short=12", "HEAD")
    assert git_state(str(tmp_path)) == (head, False)
    assert commit_label(str(tmp_path)) == head
    (tmp_path / "f.txt").write_text("two\n")
    assert commit_label(str(tmp_path)) == f"{head}-dirty"


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert commit_label(str(tmp_path)) == "unknown"
