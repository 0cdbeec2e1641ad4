"""A driver process starts in its work directory, a directory that code of a tenant's
Ray cluster may write (executors/ray/sandbox.py): nothing planted there may run before
the driver enters its sandbox (review of issue 25).  Real interpreter, real files."""
from __future__ import annotations

import os
import subprocess
import sys

from kubetune.executors.ray.process import DRIVER_COMMAND

PLANTED = "open({marker!r}, 'w').write('ran')\n"


def start_in(workdir, command):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    # no arguments: driver_main fails at once, after Python imported the kubetune package
    return subprocess.run([*command], cwd=workdir, env=env, capture_output=True, timeout=120)


def plant(tmp_path):
    workdir = tmp_path / "work"
    (workdir / "kubetune").mkdir(parents=True)
    marker = tmp_path / "marker"
    (workdir / "kubetune" / "__init__.py").write_text(PLANTED.format(marker=str(marker)))
    return workdir, marker


def test_a_package_planted_in_the_work_directory_is_not_imported(tmp_path):
    workdir, marker = plant(tmp_path)
    start_in(workdir, DRIVER_COMMAND)
    assert not marker.exists()


def test_without_the_guard_the_planted_package_would_run(tmp_path):
    # the control: the same start without -P imports the planted package first
    workdir, marker = plant(tmp_path)
    start_in(workdir, [c for c in DRIVER_COMMAND if c != "-P"])
    assert marker.read_text() == "ran"
