"""Events are queued, bounded, counted on repeat and posted in the background
(k8s/events.py, issue 26). The API side is a recording sender here; the real API server's
side is tests/integration/test_event_posting.py."""
from __future__ import annotations

import asyncio
import datetime

from kubetune.k8s.events import EventKey, EventPoster, EventQueue, Involved, Posted

from waiting import until

EXPERIMENT = Involved("Experiment", "team-a", "exp", "uid-1")
AT = datetime.datetime(2026, 11, 27, tzinfo=datetime.timezone.utc)


def key(reason: str = "TrialLaunched", message: str = "m", involved: Involved = EXPERIMENT) -> EventKey:
    return EventKey(involved, "Normal", reason, message)


def test_a_repeat_while_waiting_is_one_event_counted():
    queue = EventQueue(limit=10)
    assert queue.put(key(), AT)
    assert queue.put(key(), AT + datetime.timedelta(seconds=5))
    assert queue.put(key(message="other"), AT)
    assert len(queue) == 2
    first, seen = queue.take()
    assert first == key() and seen.count == 2 and seen.first == AT and seen.last == AT + datetime.timedelta(seconds=5)


def test_past_the_limit_new_events_are_dropped_and_counted_but_repeats_still_count():
    queue = EventQueue(limit=2)
    assert queue.put(key("A"), AT) and queue.put(key("B"), AT)
    assert not queue.put(key("C"), AT)
    assert queue.dropped == 1 and len(queue) == 2
    assert queue.put(key("A"), AT)          # already waiting: counted, nothing more held
    assert queue.dropped == 1
    assert [queue.take()[0].reason for _ in range(2)] == ["A", "B"]
    assert queue.take() is None


def test_a_repeat_after_posting_counts_on_the_posted_event_within_the_window_only():
    queue = EventQueue(window_s=600, recent=2)
    queue.record(key("A"), Posted("exp.1", 3, AT, posted_at=100.0))
    assert queue.previous(key("A"), now=700.0).name == "exp.1"
    assert queue.previous(key("A"), now=700.1) is None          # past the window: a new Event
    queue.record(key("B"), Posted("exp.2", 1, AT, 100.0))
    queue.record(key("C"), Posted("exp.3", 1, AT, 100.0))
    assert queue.previous(key("A"), now=101.0) is None          # forgotten: only `recent` are kept
    assert queue.previous(key("C"), now=101.0).name == "exp.3"


class Sender:
    """Records what would be posted; ``hold`` keeps the sends waiting until released."""

    def __init__(self) -> None:
        self.sent: list[tuple[EventKey, int, str | None]] = []
        self.fail: set[str] = set()

    def __call__(self, api, key: EventKey, seen, previous):
        if key.reason in self.fail:
            raise RuntimeError("the API server refused")
        self.sent.append((key, seen.count, previous.name if previous else None))
        name = previous.name if previous else f"{key.involved.name}.{len(self.sent)}"
        return name, (previous.count if previous else 0) + seen.count, seen.first


def test_the_poster_posts_in_the_background_counts_repeats_on_the_posted_event_and_survives_failures():
    async def scenario():
        sender, gate_entries = Sender(), []
        release = asyncio.Event()

        async def limited(call, *args):          # the gated call: waits until released
            gate_entries.append(args[1].reason)
            await release.wait()
            return call(*args)

        poster = EventPoster(limited, None, clock=lambda: 0.0, send=sender)
        for _ in range(3):
            poster.post(EXPERIMENT, "Normal", "TrialLaunched", "t-0 launched")   # returns at once
        poster.post(EXPERIMENT, "Warning", "Broken", "x")
        sender.fail.add("Broken")
        assert sender.sent == []                 # nothing posted while the gate holds
        release.set()
        await until(lambda: not poster.queue and not poster._workers, "the queue drained", 5.0)
        assert sender.sent == [(key(message="t-0 launched"), 3, None)]   # three calls, one Event, count 3
        poster.post(EXPERIMENT, "Normal", "TrialLaunched", "t-0 launched")
        await until(lambda: len(sender.sent) == 2, "the repeat posted", 5.0)
        assert sender.sent[1] == (key(message="t-0 launched"), 1, f"{EXPERIMENT.name}.1")   # counted on it
        sender.fail.clear()
        poster.post(EXPERIMENT, "Warning", "Broken", "x")                # a failed one is not remembered
        await until(lambda: len(sender.sent) == 3, "the retry posted", 5.0)
        assert sender.sent[2][2] is None
        assert len(gate_entries) == 4

    asyncio.run(scenario())


def test_messages_and_reasons_are_capped_before_queueing():
    async def scenario():
        sender = Sender()

        async def limited(call, *args):
            return call(*args)
        poster = EventPoster(limited, None, clock=lambda: 0.0, send=sender)
        poster.post(EXPERIMENT, "Warning", "R" * 500, "m" * 100_000)
        await until(lambda: sender.sent, "posted", 5.0)
        sent = sender.sent[0][0]
        assert len(sent.reason) <= 128 and len(sent.message.encode()) <= 1024

    asyncio.run(scenario())


def test_a_repeat_is_never_posted_beside_its_first_post_as_a_second_event():
    # two workers: while one posts an Event, the other must not post its repeat (a second
    # Event object, or two PATCHes counting from the same count); it takes other Events
    async def scenario():
        sender, release = Sender(), asyncio.Event()
        entered: list[str] = []

        async def limited(call, *args):
            entered.append(args[1].reason)
            await release.wait()
            return call(*args)
        poster = EventPoster(limited, None, clock=lambda: 0.0, send=sender)
        poster.post(EXPERIMENT, "Normal", "A", "m")
        await until(lambda: entered == ["A"], "the first A in flight", 5.0)
        poster.post(EXPERIMENT, "Normal", "A", "m")      # its repeat waits for it
        poster.post(EXPERIMENT, "Normal", "B", "m")      # a second worker takes B instead
        await until(lambda: entered == ["A", "B"], "B in flight beside A", 5.0)
        release.set()
        await until(lambda: len(sender.sent) == 3 and not poster._workers, "all posted", 5.0)
        a_posts = [(count, previous) for sent, count, previous in sender.sent if sent.reason == "A"]
        assert a_posts == [(1, None), (1, f"{EXPERIMENT.name}.1")]   # one Event object, counted twice

    asyncio.run(scenario())
