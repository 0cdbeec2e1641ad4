"""Status write coalescing: what is written when (controller/coalesce.py)."""
from __future__ import annotations

from kubetune.controller.coalesce import WriteCoalescer


def running(iteration: int) -> dict:
    return {"phase": "Running", "iteration": iteration, "history": [{"iteration": i} for i in range(1, iteration + 1)]}


def test_a_short_trial_gets_one_write_its_final_status():
    writes = WriteCoalescer(2.0, start_phase="Running", start_delay=1.0)
    writes.want("t", running(0))
    assert writes.due(0.0) == []                      # Running waits for start_delay
    writes.want("t", {"phase": "Succeeded", "iteration": 10})
    assert writes.due(0.6) == [("t", {"phase": "Succeeded", "iteration": 10})]   # a phase change: at once


def test_a_running_trial_is_shown_with_its_first_results_or_after_the_delay():
    writes = WriteCoalescer(2.0, start_phase="Running", start_delay=1.0)
    writes.want("t", running(0))
    assert writes.due(0.2) == []
    assert writes.due(1.2) == [("t", running(0))]      # 1 s after it was first wanted
    other = WriteCoalescer(2.0, start_phase="Running", start_delay=1.0)
    other.want("t", running(1))
    assert other.due(0.0) == [("t", running(1))]       # something to show: at once


def test_metrics_are_written_once_per_interval():
    writes = WriteCoalescer(2.0, start_phase="Running", start_delay=1.0)
    writes.want("t", running(4))
    assert writes.due(1.2) == [("t", running(4))]
    writes.written("t", running(4), 1.2)
    writes.want("t", running(9))
    assert writes.due(2.0) == []                       # metrics only: once per interval
    assert writes.can_wait("t", "Running", 2.0)        # so the caller may put off building it
    assert not writes.can_wait("t", "Stopped", 2.0)    # a phase change is never put off
    assert writes.due(3.2) == [("t", running(9))]
    assert not writes.can_wait("t", "Running", 3.2)
    assert writes.due(0.0, force=True) == [("t", running(9))]


def test_without_a_start_delay_every_phase_change_is_written_at_once():
    writes = WriteCoalescer(2.0)
    writes.want("t", running(0))
    assert writes.due(0.0) == [("t", running(0))]
    assert not writes.can_wait("never-written", "Running", 0.0)


def test_a_status_written_directly_replaces_an_older_one_still_waiting():
    # the controller writes a trial's final status ahead of stopping it, outside due()
    writes = WriteCoalescer(2.0, start_phase="Running", start_delay=1.0)
    writes.want("t", running(0))
    assert writes.due(0.0) == []
    writes.written("t", {"phase": "Succeeded", "iteration": 10}, 0.5)
    assert writes.due(5.0) == []                       # never the stale Running afterwards


def test_a_trial_taking_a_slot_is_written_after_the_one_that_freed_it():
    """Whatever order the changes came in, a snapshot between the writes never shows both
    running: the end goes out first, then the start (the rest keep their order)."""
    writes = WriteCoalescer(5.0, start_phase="Running")
    for key in ("b", "a", "c"):
        writes.seed(key, {"phase": "Running" if key == "a" else "Queued"}, 0.0)
    writes.want("b", {"phase": "Running", "history": [1]})      # took the slot a freed
    writes.want("a", {"phase": "Succeeded"})
    writes.want("c", {"phase": "Failed"})
    assert [key for key, _ in writes.due(1.0)] == ["a", "c", "b"]
