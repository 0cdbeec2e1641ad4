"""Driver work directories left behind are removed by the next operator, across container
restarts too (executors/ray/workdirs.py): an emptyDir outlives the container, and every
container's operator is pid 1, so "is its pid alive" cannot tell the previous container's
directories from this one's.  Real directories, real /proc."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kubetune.executors.ray import workdirs
from kubetune.executors.ray.workdirs import PREFIX, new_workdir, process_identity, remove_orphans

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")


def planted(root, name: str) -> str:
    path = root / f"{PREFIX}{name}"
    path.mkdir()
    (path / "ray-session").write_text("left by a driver")
    return str(path)


def an_ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_previous_containers_directories_are_removed_though_its_operator_had_this_pid(tmp_path):
    pid, start, boot = process_identity(os.getpid()).split(".")
    # the container before a restart: its operator had the same pid (1 in a pod), started earlier
    earlier = planted(tmp_path, f"p{pid}.{int(start) - 1}.{boot}-abc123")
    other_boot = planted(tmp_path, f"p{pid}.{start}.{'f' * len(boot)}-abc123")
    mine = new_workdir(str(tmp_path))
    assert os.path.basename(mine).startswith(f"{PREFIX}p{pid}.{start}.{boot}-")
    assert not os.path.exists(earlier) and not os.path.exists(other_boot)
    assert os.path.isdir(mine) and os.stat(mine).st_mode & 0o777 == 0o700
    # a later operator in this process (the next driver) keeps this process's own directory
    second = new_workdir(str(tmp_path))
    assert os.path.isdir(mine) and os.path.isdir(second)


def test_the_directories_of_a_running_operator_are_kept_and_those_of_an_ended_one_removed(tmp_path):
    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        kept = planted(tmp_path, f"p{process_identity(running.pid)}-xyz")
        ended = an_ended_pid()
        gone = planted(tmp_path, f"p{ended}.12345.{process_identity(os.getpid()).split('.')[2]}-xyz")
        removed = remove_orphans(str(tmp_path))
        assert removed == [gone]
        assert os.path.isdir(kept)
    finally:
        running.stdin.close()
        running.wait()


def test_directories_named_by_earlier_versions_are_removed_when_their_pid_is_ambiguous_or_gone(tmp_path):
    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        own = planted(tmp_path, f"{os.getpid()}-old")          # this process names none so: a previous container's
        gone = planted(tmp_path, f"{an_ended_pid()}-old")
        alive = planted(tmp_path, f"{running.pid}-old")        # another running process: maybe an operator
        unrelated = planted(tmp_path, "not-ours")
        (tmp_path / f"{PREFIX}1-a-file").write_text("not a directory")
        assert sorted(remove_orphans(str(tmp_path))) == sorted([own, gone])
        assert os.path.isdir(alive) and os.path.isdir(unrelated)
        assert (tmp_path / f"{PREFIX}1-a-file").exists()
    finally:
        running.stdin.close()
        running.wait()


def test_a_process_identity_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    script = tmp_path / "a (strange) name"
    script.write_text("import sys; sys.stdin.read()\n")
    # the command name /proc shows is the executable's; a symlink named oddly sets it
    odd = tmp_path / "py (x) y"
    odd.symlink_to(sys.executable)
    running = subprocess.Popen([str(odd), str(script)], stdin=subprocess.PIPE)
    try:
        identity = process_identity(running.pid)
        pid, start, boot = identity.split(".")
        assert int(pid) == running.pid and start.isdigit() and boot
        assert identity != process_identity(os.getpid())
    finally:
        running.stdin.close()
        running.wait()
    assert process_identity(running.pid) is None
    assert workdirs._orphaned(f"p{identity}-x", own_pid=os.getpid())
