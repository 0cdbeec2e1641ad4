"""LISTs of Trials asked together share one request (issue 26, k8s/trial_lists.py): the
Experiments of a namespace applied at once wait for one token, not one each.  The API
server's side (a set-based selector, pages) is tests/integration/test_store_pages.py."""
from __future__ import annotations

import asyncio

import pytest

from kubetune.k8s import rate_limit, trial_lists
from kubetune.k8s.client import EXPERIMENT_LABEL


def trial(experiment: str, index: int) -> dict:
    return {"metadata": {"name": f"{experiment}-{index}", "labels": {EXPERIMENT_LABEL: experiment}}}


class Namespace:
    """What a LIST of one namespace's Trials by a set of label values answers."""

    def __init__(self, *experiments: str) -> None:
        self.trials = [trial(e, i) for e in experiments for i in range(2)]
        self.asked: list[list[str]] = []

    async def fetch(self, values: list[str]) -> list[dict]:
        self.asked.append(values)
        await asyncio.sleep(0)
        return [t for t in self.trials if t["metadata"]["labels"][EXPERIMENT_LABEL] in values]


def ask(namespace: str, experiment: str, fetch):
    """A LIST of one Experiment's Trials, admitted by the rate limit alone."""
    return trial_lists.trials_of(namespace, experiment, EXPERIMENT_LABEL, rate_limit.acquire, fetch)


def names(trials: list[dict]) -> list[str]:
    return sorted(t["metadata"]["name"] for t in trials)


@pytest.fixture
def slow_bucket(monkeypatch):
    """No token left, 20 a second: every request waits for its turn (a burst of Experiments)."""
    bucket = rate_limit.TokenBucket(qps=20.0, burst=1)
    bucket.delay()
    monkeypatch.setattr(rate_limit, "_bucket", bucket)
    return bucket


def test_lists_asked_while_one_waits_for_its_token_share_it(slow_bucket):
    ns = Namespace("a", "b", "c")

    async def main():
        return await asyncio.gather(*(ask("ns", e, ns.fetch) for e in "abc"))
    answers = asyncio.run(main())
    assert ns.asked == [["a", "b", "c"]]          # one request, one token
    assert [names(a) for a in answers] == [["a-0", "a-1"], ["b-0", "b-1"], ["c-0", "c-1"]]


def test_each_namespace_lists_its_own_and_a_batch_is_bounded(slow_bucket, monkeypatch):
    monkeypatch.setattr(trial_lists, "MAX_BATCH", 2)
    one, two = Namespace("a", "b", "c"), Namespace("a")

    async def main():
        return await asyncio.gather(*(ask("one", e, one.fetch) for e in "abc"),
                                    ask("two", "a", two.fetch))
    answers = asyncio.run(main())
    assert one.asked == [["a", "b"], ["c"]] and two.asked == [["a"]]
    assert [names(a) for a in answers] == [["a-0", "a-1"], ["b-0", "b-1"], ["c-0", "c-1"], ["a-0", "a-1"]]


def test_a_list_asked_after_the_batch_went_is_a_request_of_its_own(monkeypatch):
    monkeypatch.setattr(rate_limit, "_bucket", rate_limit.TokenBucket(qps=20.0, burst=10))
    ns = Namespace("a", "b")

    async def main():
        first = await ask("ns", "a", ns.fetch)
        return first, await ask("ns", "b", ns.fetch)
    first, second = asyncio.run(main())
    assert ns.asked == [["a"], ["b"]]            # nothing was held back to make a batch
    assert names(first) == ["a-0", "a-1"] and names(second) == ["b-0", "b-1"]


def test_a_shared_list_that_failed_once_is_asked_again_by_each_alone(slow_bucket):
    ns = Namespace("a", "b")
    failing = [True]

    async def fetch(values):
        if failing.pop() if failing else False:
            raise ConnectionResetError("the API server went away")
        return await ns.fetch(values)

    async def main():
        return await asyncio.gather(*(ask("ns", e, fetch) for e in "ab"))
    a, b = asyncio.run(main())
    assert names(a) == ["a-0", "a-1"] and names(b) == ["b-0", "b-1"]


def test_a_list_failing_for_everyone_fails_every_asker_and_the_next_asks_again(slow_bucket):
    ns = Namespace("a", "b")
    down = [True]

    async def fetch(values):
        if down[0]:
            raise ConnectionResetError("the API server went away")
        return await ns.fetch(values)

    async def main():
        results = await asyncio.gather(*(ask("ns", e, fetch) for e in "ab"), return_exceptions=True)
        down[0] = False
        return results, await ask("ns", "a", fetch)
    results, again = asyncio.run(main())
    assert all(isinstance(r, ConnectionResetError) for r in results)
    assert names(again) == ["a-0", "a-1"]


def test_an_asker_cancelled_while_waiting_does_not_cancel_the_others(slow_bucket):
    ns = Namespace("a", "b")

    async def main():
        first = asyncio.ensure_future(ask("ns", "a", ns.fetch))
        second = asyncio.ensure_future(ask("ns", "b", ns.fetch))
        await asyncio.sleep(0)
        first.cancel()       # its Experiment deleted while the LIST waited for a token
        return await second
    assert names(asyncio.run(main())) == ["b-0", "b-1"]
    assert ns.asked == [["a", "b"]]


def test_the_selector_is_an_equality_for_one_and_a_set_for_more():
    assert trial_lists.label_selector(EXPERIMENT_LABEL, ["a"]) == f"{EXPERIMENT_LABEL}=a"
    assert trial_lists.label_selector(EXPERIMENT_LABEL, ["a", "b"]) == f"{EXPERIMENT_LABEL} in (a,b)"


def test_a_shared_list_that_fails_is_asked_again_by_each_alone_so_one_cannot_fail_the_others(slow_bucket):
    # one tenant's Experiment whose value the API server refuses must not fail the LISTs of
    # the Experiments that joined its request (found by review)
    ns = Namespace("a", "b", "c")

    async def fetch(values: list[str]) -> list[dict]:
        if "b" in values:
            ns.asked.append(values)
            raise RuntimeError("400 Bad Request: invalid label value")
        return await ns.fetch(values)

    async def main():
        return await asyncio.gather(*(ask("ns", e, fetch) for e in "abc"), return_exceptions=True)
    a, b, c = asyncio.run(main())
    assert names(a) == ["a-0", "a-1"] and names(c) == ["c-0", "c-1"]
    assert isinstance(b, RuntimeError)
    assert ns.asked[0] == ["a", "b", "c"] and sorted(map(tuple, ns.asked[1:])) == [("a",), ("b",), ("c",)]


def test_a_name_too_long_for_a_label_value_lists_alone():
    ns = Namespace("a")
    long = "x" * 64

    async def main():
        return await asyncio.gather(ask("ns", "a", ns.fetch), ask("ns", long, ns.fetch))
    asyncio.run(main())
    assert [long] in ns.asked
