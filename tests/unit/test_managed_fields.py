"""A finished Trial's managedFields are stripped once its terminal status is written, a
running one's never; a refused strip leaves the status alone and is retried, then given
up; a refusal retrying cannot cure (403, 422) ends stripping with one warning
(controller/managed_fields.py).  On the real API server: tests/integration/test_operator.py."""
from __future__ import annotations

import asyncio

from kubetune.controller.managed_fields import MAX_TRIES, ManagedFieldsStrip, needs_strip
from kubetune.controller.store import MemoryStore
from kubetune.core.types import CreateTrial, LaunchTrial, Result
from kubetune.k8s.errors import WriteRefused
from unit_helpers import controller_with_runner


def trial(name: str, phase: str | None, managed: bool) -> dict:
    metadata = {"name": name, **({"managedFields": [{"manager": "kubetune", "operation": "Update"}]} if managed else {})}
    return {"metadata": metadata, **({"status": {"phase": phase}} if phase else {})}


def test_only_finished_trials_with_a_record_are_due_after_a_restart():
    strip = ManagedFieldsStrip()
    strip.restored([trial("done", "Succeeded", True), trial("failed", "Failed", True), trial("stopped", "Stopped", True),
                    trial("clean", "Succeeded", False), trial("running", "Running", True),
                    trial("paused", "Paused", True), trial("new", None, True)])
    assert strip.due(0.0) == ["done", "failed", "stopped"]
    assert not needs_strip(trial("clean", "Succeeded", False)) and needs_strip(trial("done", "Succeeded", True))


def test_a_status_write_makes_a_strip_due_only_once_terminal_and_only_once():
    strip = ManagedFieldsStrip()
    for phase in ("Pending", "Queued", "Running", "Paused"):
        strip.finished("t", {"phase": phase})
    assert not strip and strip.due(0.0) == []
    strip.finished("t", {"phase": "Succeeded"})
    strip.finished("t", {"phase": "Succeeded"})       # a later write of the finished Trial
    assert strip.due(0.0) == ["t"]
    strip.stripped("t")
    assert not strip


def test_a_refused_strip_waits_a_backoff_and_is_given_up_after_max_tries():
    strip = ManagedFieldsStrip()
    strip.finished("t", {"phase": "Failed"})
    now = 0.0
    for _ in range(MAX_TRIES - 1):
        assert strip.due(now) == ["t"]
        assert strip.failed("t", now) is False
        assert strip.due(now) == []                   # not before its backoff
        now += 60.0
    assert strip.due(now) == ["t"]
    assert strip.failed("t", now) is True             # given up: nothing left to hold the controller
    assert not strip and strip.due(now + 60.0) == []


def test_a_flush_bounds_the_strips_it_sends():
    strip = ManagedFieldsStrip()
    for i in range(40):
        strip.finished(f"t{i}", {"phase": "Succeeded"})
    assert len(strip.due(0.0, limit=16)) == 16


def test_a_refusal_retrying_cannot_cure_ends_stripping_and_warns_once():
    strip = ManagedFieldsStrip()
    for name in ("a", "b"):
        strip.finished(name, {"phase": "Succeeded"})
    assert strip.refuse("403 Forbidden: cannot patch resource trials") is True
    assert strip.refuse("403 Forbidden: cannot patch resource trials") is False     # warned once
    assert not strip and strip.due(0.0) == []
    strip.finished("c", {"phase": "Succeeded"})
    strip.restored([trial("d", "Succeeded", True)])
    assert strip.failed("a", 0.0) is True and not strip      # a strip in flight meanwhile adds nothing
    assert strip.due(0.0) == []


class RecordingStore(MemoryStore):
    """The local store, with the strips it is asked for, refusing the first ``refuse``
    (with ``status``)."""

    def __init__(self, refuse: int = 0, status: int = 500) -> None:
        super().__init__()
        self.stripped: list[str] = []
        self.asked = 0
        self.refuse, self.status = refuse, status

    async def strip_managed_fields(self, trial: str) -> None:
        self.asked += 1
        if self.refuse:
            self.refuse -= 1
            raise WriteRefused(self.status, "Forbidden" if self.status == 403 else "InternalError", "refused")
        self.stripped.append(trial)


def two_trials(store: RecordingStore, clock: list[float]):
    controller, runner, decisions = controller_with_runner(store, clock, maxTrials=2, parallelism=2)
    creates = [d for d in decisions if isinstance(d, CreateTrial)]
    launches = [d for d in decisions if isinstance(d, LaunchTrial)]
    return controller, runner, creates, [launch.name for launch in launches]


def test_the_status_writer_strips_a_trial_once_its_terminal_status_is_written_never_a_running_one():
    store, clock = RecordingStore(refuse=1), [1.0]
    controller, runner, creates, (done, running) = two_trials(store, clock)

    async def scenario() -> None:
        await controller.effects.apply(creates)
        for name in (done, running):
            runner.on_trial_launched(name, 1.0)
            runner.on_trial_result(name, Result(seq=1, iteration=1, metrics={"loss": 0.5}, timestamp=1.0), 1.0)
        controller.ctx.touched |= {done, running}
        clock[0] = 5.0
        await controller.flush()
        assert store.stripped == [] and not controller.status.fields_strip      # both Running
        runner.on_trial_completed(done, 6.0)
        controller.ctx.touched.add(done)
        clock[0] = 6.0
        await controller.flush()          # the status goes out; the strip is refused
        assert store.trials[done]["status"]["phase"] == "Succeeded"
        assert store.stripped == [] and controller.status.fields_strip
        assert controller.status.failures.condition() is None    # not a status write failure
        await controller.flush()          # within the backoff: not tried again
        assert store.stripped == []
        clock[0] = 60.0
        await controller.flush()
        assert store.stripped == [done] and not controller.status.fields_strip
        clock[0] = 120.0
        await controller.flush()          # once is enough
        assert store.stripped == [done]
        assert store.trials[running]["status"]["phase"] == "Running"
    asyncio.run(scenario())


def test_a_forbidden_strip_is_not_asked_again_for_any_trial():
    store, clock = RecordingStore(refuse=5, status=403), [1.0]
    controller, runner, creates, names = two_trials(store, clock)

    async def scenario() -> None:
        await controller.effects.apply(creates)
        for i, name in enumerate(names):
            runner.on_trial_launched(name, 1.0)
            runner.on_trial_result(name, Result(seq=1, iteration=1, metrics={"loss": 0.5}, timestamp=1.0), 1.0)
            runner.on_trial_completed(name, 2.0 + i)
            controller.ctx.touched.add(name)
            clock[0] = 10.0 + 100 * i
            await controller.flush()
            assert store.trials[name]["status"]["phase"] == "Succeeded"
        assert store.asked == 1 and store.stripped == []      # the second Trial's strip is not sent
        assert not controller.status.fields_strip and controller.status.failures.condition() is None
    asyncio.run(scenario())
