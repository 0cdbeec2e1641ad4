"""processes.HostProcess: the one start/wait/stop/log-tail implementation that kwok,
Kueue's manager and the KubeRay operator share, on real (tiny) host processes."""
from __future__ import annotations

import sys
import time

import pytest

from kubetune.devcluster import processes


class Tiny(processes.HostProcess):
    name = "tiny"
    log_name = "tiny.log"
    record_name = "tiny.json"


class TinyError(RuntimeError):
    pass


class Strict(Tiny):
    exited_error = timeout_error = TinyError


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_an_exit_while_waiting_raises_at_once_with_the_exit_code_and_the_log_tail(tmp_path):
    proc = Tiny(tmp_path / "kubeconfig", tmp_path / "state")
    proc._spawn(_python("print('bad flag --frobnicate', flush=True); raise SystemExit(3)"))
    started = time.monotonic()
    with pytest.raises(RuntimeError) as error:
        proc.wait_until(time.monotonic() + 60, lambda: False, "ready")
    assert time.monotonic() - started < 30      # not the deadline: the exit
    assert "tiny exited with code 3 while waiting until ready" in str(error.value)
    assert "bad flag --frobnicate" in str(error.value)


def test_the_deadline_raises_the_subclass_error_and_stop_removes_process_and_record(tmp_path):
    proc = Strict(tmp_path / "kubeconfig", tmp_path / "state")
    proc._spawn(_python("import time; print('still starting', flush=True); time.sleep(600)"))
    record = proc.record
    assert (tmp_path / "state" / "tiny.json").is_file()
    with pytest.raises(TinyError, match="tiny: not answering in time"):
        proc.wait_until(time.monotonic() + 0.5, lambda: False, "answering")
    assert record.is_alive()                    # a timeout alone stops nothing
    proc.stop()
    assert not record.is_alive() and not (tmp_path / "state" / "tiny.json").exists()


def test_attach_finds_a_process_another_start_left_running(tmp_path):
    first = Tiny(tmp_path / "kubeconfig", tmp_path / "state", die_with_parent=False)
    first._spawn(_python("import time; time.sleep(600)"))
    try:
        second = Tiny(tmp_path / "kubeconfig", tmp_path / "state")
        assert second._load_record() and second.record.pid == first.record.pid
        second.wait_until(time.monotonic() + 5, lambda: True, "anything")   # holds at once
        second.stop()
        assert not first.record.is_alive()
        assert not Tiny(tmp_path / "kubeconfig", tmp_path / "state")._load_record()
    finally:
        first.stop()
