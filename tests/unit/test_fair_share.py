"""Fair sharing of one cluster's ledger between namespaces and Experiments (issue 26,
core/fair_share.py): property tests over random queues, weights, and the wake of the
Experiment first in line."""
from __future__ import annotations

from collections import Counter

from hypothesis import given, settings, strategies as st

from kubetune.core.fair_share import fair_keys, groups
from kubetune.core.feasibility import waiting_for_room
from kubetune.core.resources import ResourceLedger, Resources

CPU = [Resources(cpu=1.0)]


def _ledger(cpus: float, weights: dict[str, float] | None = None) -> ResourceLedger:
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=cpus), [Resources(cpu=cpus)])
    ledger.set_weights(weights or {})
    return ledger


def _grant_all_allowed(ledger: ResourceLedger, owners: list[str]) -> list[str]:
    """What the runners' cycles do, in any order: each waiting owner tries; until no one can."""
    granted = []
    progress = True
    while progress:
        progress = False
        for owner in owners:
            if owner not in granted and ledger.try_acquire(owner, CPU):
                granted.append(owner)
                progress = True
    return granted


def _held(granted: list[str], level: int) -> Counter:
    return Counter(groups(owner)[level] for owner in granted)


queues = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(queues, st.integers(1, 12), st.randoms(use_true_random=False))
def test_free_capacity_goes_to_whoever_holds_least(requests, cpus, random):
    """Whatever the arrival order, once the cluster is full no namespace that still waits
    holds more than one trial less than another; the same between the Experiments of a
    namespace (max-min fairness at both levels)."""
    ledger = _ledger(cpus)
    owners = [f"ns{n}/exp{e}/t{i}" for i, (n, e) in enumerate(requests)]
    for owner in owners:
        ledger.set_waiting(owner, CPU)
    tries = list(owners)
    random.shuffle(tries)
    granted = _grant_all_allowed(ledger, tries)
    assert len(granted) == min(cpus, len(owners))                # no capacity left idle
    still_waiting = [owner for owner in owners if owner not in granted]
    by_namespace = _held(granted, 0)
    for owner in still_waiting:
        namespace, experiment = groups(owner)
        assert all(by_namespace[namespace] >= held - 1 for held in by_namespace.values()), (by_namespace, owner)
        in_namespace = Counter(groups(o)[1] for o in granted if groups(o)[0] == namespace)
        assert all(in_namespace[experiment] >= held - 1 for held in in_namespace.values()), (in_namespace, owner)


@settings(max_examples=100, deadline=None)
@given(queues)
def test_joining_the_end_of_the_line_orders_as_a_rebuild_does(requests):
    """A new arrival takes its key without rebuilding the line when it goes last; the
    line is the same as one built from scratch."""
    ledger = _ledger(2.0)
    ledger.try_acquire("ns0/big/held", [Resources(cpu=1.0)])
    owners = [f"ns{n}/exp{e}/t{i}" for i, (n, e) in enumerate(requests)]
    for owner in owners:
        ledger.set_waiting(owner, CPU)
        ledger.queue_reason(owner)        # builds the line, so the next arrival may append
    incremental = [owner for owner, _ in ledger._current_line().queue]
    ledger._line = None
    assert [owner for owner, _ in ledger._current_line().queue] == incremental


def test_a_late_experiment_is_served_before_one_that_holds_the_cluster():
    ledger = _ledger(4)
    early = [f"team/early/t{i}" for i in range(20)]
    for owner in early:
        ledger.set_waiting(owner, CPU)
    assert _grant_all_allowed(ledger, early) == early[:4]
    ledger.set_waiting("team/late/t0", CPU)
    ledger.release(early[0])
    assert not ledger.try_acquire(early[4], CPU)        # arrived first, but holds 3 of 4
    assert ledger.try_acquire("team/late/t0", CPU)


def test_namespace_weights_split_a_saturated_cluster_in_their_ratio():
    ledger = _ledger(9, weights={"gold": 2.0})
    owners = [f"{ns}/exp/t{i}" for i in range(30) for ns in ("gold", "bronze")]
    for owner in owners:
        ledger.set_waiting(owner, CPU)
    granted = _grant_all_allowed(ledger, owners)
    assert _held(granted, 0) == {"gold": 6, "bronze": 3}


def test_one_namespace_with_many_experiments_does_not_crowd_out_another():
    """Fair between namespaces first: ten Experiments of one team get half, not 10/11."""
    ledger = _ledger(10)
    owners = [f"crowd/exp{e}/t{i}" for e in range(10) for i in range(2)] + [f"solo/exp/t{i}" for i in range(10)]
    for owner in owners:
        ledger.set_waiting(owner, CPU)
    assert _held(_grant_all_allowed(ledger, owners), 0) == {"crowd": 5, "solo": 5}


def test_priority_still_comes_first():
    ledger = _ledger(1)
    ledger.set_waiting("a/low/t0", CPU, priority=0)
    ledger.set_waiting("b/high/t0", CPU, priority=5)
    ledger.set_waiting("b/high/t1", CPU, priority=5)
    assert not ledger.try_acquire("a/low/t0", CPU)
    assert ledger.try_acquire("b/high/t0", CPU, priority=5)
    ledger.release("b/high/t0")
    assert ledger.try_acquire("b/high/t1", CPU, priority=5)   # even though b holds more than a


def test_on_equal_shares_the_experiment_served_less_goes_before_the_earlier_arrival():
    """Namespaces a and b hold one trial each; a's early Experiment asks for a second, b's
    late one for its first: both would make their namespace hold two of three. The tie
    went to the earlier arrival (issue 26: the last applied Experiments starved); now to
    the Experiment that was granted fewer trials so far."""
    ledger = _ledger(3)
    assert ledger.try_acquire("a/early/t0", CPU) and ledger.try_acquire("b/other/t0", CPU)
    ledger.set_waiting("a/early/t1", CPU)
    ledger.set_waiting("b/late/t0", CPU)
    assert not ledger.try_acquire("a/early/t1", CPU)
    assert ledger.try_acquire("b/late/t0", CPU)


def test_keys_depend_on_holdings_not_on_arrival():
    from kubetune.core.fair_share import Request
    total = Resources(cpu=4)
    waiting = [Request("x/a/t1", Resources(cpu=1), 0, 1), Request("y/b/t2", Resources(cpu=1), 0, 2)]
    keys, _ = fair_keys(waiting, {"x/a/t0": Resources(cpu=2)}, total, {})
    assert keys["y/b/t2"] < keys["x/a/t1"]


def test_the_experiment_first_in_line_is_woken_when_room_frees():
    ledger = _ledger(1)
    woken = []
    ledger.watch("ns/a/", lambda: woken.append("a"))
    ledger.watch("ns/b/", lambda: woken.append("b"))
    assert ledger.try_acquire("ns/a/t0", CPU)
    ledger.set_waiting("ns/b/t0", CPU)
    ledger.set_waiting("ns/a/t1", CPU)
    assert woken == []                      # nothing fits: nobody to wake
    ledger.release("ns/a/t0")
    assert woken == ["b"]                   # first in line: b's trial, waiting longer
    assert not ledger.try_acquire("ns/a/t1", CPU)
    assert ledger.try_acquire("ns/b/t0", CPU)
    ledger.unwatch("ns/a/")
    ledger.release("ns/b/t0")
    assert woken == ["b"]                   # a's trial is first now, but a stopped watching


def test_namespace_weights_come_from_the_operator_flag():
    import pytest
    from kubetune import cli
    from kubetune.settings import SettingError, from_args

    def parsed(*argv):
        return from_args(cli.build_parser().parse_args(["operator", *argv])).namespace_weights
    assert parsed() == ()
    assert parsed("--namespace-weight=team-a=2,team-b=0.5", "--namespace-weight", "team-c=3") == (
        ("team-a", 2.0), ("team-b", 0.5), ("team-c", 3.0))
    for wrong, named in (("team-a=0", "must be a number > 0"), ("team-a=x", "must be a number"),
                         ("Team_A=2", "is not a namespace name"), ("team-a", "must be a number")):
        with pytest.raises(SettingError, match=f"--namespace-weight: .*{named}"):
            parsed(f"--namespace-weight={wrong}")


def test_a_queued_trials_words_stay_the_same_while_the_line_moves():
    """Each change of a queued Trial's message is a status write of it (issue 26: 9.3
    PATCHes per trial with 200 Experiments). Its place in line, the free amount, and
    whether the room just freed goes to someone ahead all move with every grant and
    release: none of them is in it. Watched after each release (room free, someone
    else's turn) and after each grant (nothing free)."""
    ledger = _ledger(1)
    holder = "a/x/t0"
    assert ledger.try_acquire(holder, CPU)
    waiting = [f"b/y/t{i}" for i in range(5)] + ["c/z/t0", "c/z/t1"]
    for owner in waiting:
        ledger.set_waiting(owner, CPU)
    watched = waiting[-3]
    said, turns, full = set(), 0, 0
    while watched in waiting:
        said.add(ledger.queue_reason(watched))   # nothing free
        full += 1
        ledger.release(holder)                  # room for one: whose turn is it?
        if not ledger.next_owner_allowed(watched):
            said.add(ledger.queue_reason(watched))
            turns += 1
        holder = next(owner for owner in waiting if ledger.try_acquire(owner, CPU))
        waiting.remove(holder)
    assert turns >= 3 and full >= 3 and said == {waiting_for_room("CPU", 1, 1)}, said


def _first_cycle(ledger: ResourceLedger, experiment: str, parallelism: int, woken: list[str] | None = None) -> int:
    """An Experiment's first cycle as the controller makes it: it watches, asks for
    ``parallelism`` trials at once, and is ``started``; how many were granted."""
    ledger.watch(experiment, lambda: woken.append(experiment) if woken is not None else None)
    granted = 0
    for i in range(parallelism):
        owner = f"{experiment}t{i}"
        ledger.set_waiting(owner, CPU)
        granted += ledger.try_acquire(owner, CPU)
    ledger.started(experiment)        # after its first step, as the controller does
    return granted


def _woken_cycles(ledger: ResourceLedger, woken: list[str], granted: dict[str, int]) -> None:
    """The cycles the wakes bring: each woken Experiment tries its waiting trials again."""
    while woken:
        experiment = woken.pop(0)
        for owner in [o for o in list(ledger._waiting) if o.startswith(experiment)]:
            granted[experiment] += ledger.try_acquire(owner, CPU)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 12), st.integers(2, 4), st.integers(1, 3), st.randoms(use_true_random=False))
def test_experiments_started_together_each_get_a_first_trial_before_anyone_a_second(
        experiments, parallelism, namespaces, random):
    """A burst (many applied at once, or restored after a restart): each Experiment is
    built, then asks for ``parallelism`` trials in its first cycle, one after another.
    The line orders only who waits, so without room kept for those still being built,
    the first ones built took ``parallelism`` each and the last waited a whole round of
    trials for their first (issue 26: 0.42-0.65 of their fair share).  Now the grants
    are what fair sharing gives when all ask at once: at most one trial apart."""
    cpus = experiments                         # one trial each fits, two each do not
    ledger = _ledger(cpus)
    names = [f"ns{i % namespaces}/e{i}/" for i in range(experiments)]
    for name in names:
        ledger.starting(name)
    order = list(names)
    random.shuffle(order)
    woken: list[str] = []
    first = {name: _first_cycle(ledger, name, parallelism, woken) for name in order}
    _woken_cycles(ledger, woken, first)
    by_namespace = Counter()
    for name, granted in first.items():
        by_namespace[groups(name + "t")[0]] += granted
    assert sum(first.values()) == cpus                        # nothing left idle
    for name, granted in first.items():
        if granted:
            continue
        # one that got nothing was behind fair sharing only: no Experiment of its own
        # namespace got a second trial, and its namespace holds at most one trial less
        # than any other (whole trials: 5 between 2 namespaces is 3 and 2)
        namespace = groups(name + "t")[0]
        assert all(first[other] <= 1 for other in first if groups(other + "t")[0] == namespace), first
        assert by_namespace[namespace] >= max(by_namespace.values()) - 1, first
    # with nobody starting, the room is not kept: a lone Experiment takes what is free
    lone = _ledger(4)
    assert _first_cycle(lone, "ns/solo/", 3) == 3


def test_room_kept_for_a_starting_experiment_frees_when_it_gives_up():
    ledger = _ledger(2)
    woken = []
    ledger.starting("ns/late/")
    assert _first_cycle(ledger, "ns/a/", 2) == 1
    assert ledger.queue_reason("ns/a/t1") == waiting_for_room("CPU", 1, 2)      # room kept for the starter
    ledger.watch("ns/a/", lambda: woken.append("a"))
    ledger.watch("ns/late/", lambda: None)     # watching is not asking: the room stays kept
    assert not ledger.try_acquire("ns/a/t1", CPU) and woken == []
    ledger.unwatch("ns/late/")                 # it stopped (deleted): it will not ask
    assert woken == ["a"] and ledger.try_acquire("ns/a/t1", CPU)
