"""Resources arithmetic and the shared per-cluster ResourceLedger."""
import random

import pytest

from kubetune.core.resources import Resources, ResourceLedger, trial_bundles
from kubetune.spec.model import TrialResources

GiB = 2**30


def cpu(n, gpu=0.0, **custom):
    return Resources(cpu=n, gpu=gpu, custom=custom)


def test_arithmetic_never_goes_negative_and_does_not_drift():
    a = Resources(cpu=1, gpu=1, memory=GiB, custom={"TPU": 2})
    assert (a - Resources(cpu=3, custom={"TPU": 5})) == Resources(gpu=1, memory=GiB)
    total = Resources()
    for _ in range(10):
        total = total + cpu(0.1)
    assert total.cpu == 1.0
    assert (total - cpu(0.3)).cpu == 0.7


def test_fits_and_ratio():
    node = Resources(cpu=8, gpu=2, memory=16 * GiB)
    assert Resources(cpu=8, gpu=2).fits(node)
    assert not Resources(cpu=1, gpu=3).fits(node)
    assert not cpu(1, TPU=1).fits(node)
    assert Resources(cpu=4, gpu=1).ratio(node) == 0.5
    assert cpu(1, TPU=1).ratio(node) == float("inf")


def test_trial_bundles_total_is_bundle_times_count():
    bundles = trial_bundles(TrialResources(cpu=2, gpu=1, memory=GiB, custom={"TPU": 1}, bundles=3))
    assert len(bundles) == 3
    assert sum((b for b in bundles), Resources()) == Resources(cpu=6, gpu=3, memory=3 * GiB, custom={"TPU": 3})


def test_a_trials_resources_answer_amount_as_any_resources():
    # TrialResources is a Resources: amount(kind) is one bundle's amount of that kind, as
    # for any Resources (it once overrode amount() with another signature); per_bundle()
    # is the bundle the ledger holds
    resources = TrialResources(cpu=2, gpu=1, bundles=3)
    assert resources.amount("GPU") == 1.0 and resources.amount("CPU") == 2.0
    assert resources.per_bundle() == Resources(cpu=2, gpu=1)
    assert trial_bundles(resources) == [Resources(cpu=2, gpu=1)] * 3


def test_from_ray_ignores_node_markers():
    r = Resources.from_ray({"CPU": 4.0, "GPU": 1.0, "memory": 1e9, "node:10.0.0.1": 1.0,
                            "object_store_memory": 5e8, "accelerator_type:A100": 1.0})
    assert r.cpu == 4 and r.gpu == 1 and r.custom == {"accelerator_type:A100": 1.0}
    assert r.to_ray() == {"CPU": 4.0, "GPU": 1.0, "memory": 1e9, "accelerator_type:A100": 1.0}


def ledger(nodes, node_types=None):
    led = ResourceLedger()
    led.set_capacity(sum(nodes, Resources()), nodes, node_types)
    return led


def test_nothing_starts_before_capacity_is_known():
    led = ResourceLedger()
    assert not led.try_acquire("a", [cpu(1)])
    assert led.feasibility([cpu(100)]) is None        # unknown: do not fail trials yet
    led.set_waiting("a", [cpu(1)])
    assert "capacity" in led.queue_reason("a")


def test_bundles_are_all_or_nothing_and_placed_per_node():
    led = ledger([cpu(4), cpu(4)])
    # Three 3-CPU bundles: 9 CPU fit in 8 total? no; and per node only one each fits.
    assert not led.try_acquire("big", [cpu(3)] * 3)
    assert led.used() == Resources() and not led.holds("big")
    assert led.try_acquire("pair", [cpu(3)] * 2)
    # 2 CPU remain in total but 1 per node: a 2-CPU bundle is fragmented out.
    assert led.free() == cpu(2)
    assert not led.try_acquire("frag", [cpu(2)])
    led.set_waiting("frag", [cpu(2)])
    assert "on one node" in led.queue_reason("frag")
    # "frag" waits for CPU, so a later CPU request may not take the CPU it needs.
    assert not led.try_acquire("small", [cpu(1), cpu(1)])
    led.clear_waiting("frag")
    assert led.try_acquire("small", [cpu(1), cpu(1)])
    led.release("pair")
    assert led.free() == cpu(6)


def test_double_acquire_is_a_bug_not_a_silent_overcommit():
    led = ledger([cpu(4)])
    assert led.try_acquire("a", [cpu(1)])
    with pytest.raises(ValueError):
        led.try_acquire("a", [cpu(1)])


def test_ledger_never_negative_under_random_churn():
    rng = random.Random(3)
    led = ledger([Resources(cpu=4, gpu=1), Resources(cpu=8, gpu=2)])
    holders = set()
    for step in range(2000):
        owner = f"t{rng.randrange(30)}"
        if owner in holders and rng.random() < 0.5:
            led.release(owner)
            holders.discard(owner)
        elif owner not in holders:
            bundles = [Resources(cpu=rng.choice([0.5, 1, 2, 3]), gpu=rng.choice([0, 0, 1]))] * rng.randint(1, 3)
            if led.try_acquire(owner, bundles):
                holders.add(owner)
        if step % 500 == 0:   # nodes come and go
            led.set_capacity(Resources(cpu=12, gpu=3), [Resources(cpu=4, gpu=1), Resources(cpu=8, gpu=2)])
        free, used = led.free(), led.used()
        assert free.cpu >= 0 and free.gpu >= 0
        assert used.cpu <= 12 + 1e-9 and used.gpu <= 3 + 1e-9
        assert all(n.cpu >= 0 and n.gpu >= 0 for n in led._node_free)
    for owner in holders:
        led.release(owner)
    assert led.used() == Resources() and led.free() == Resources(cpu=12, gpu=3)


def test_infeasible_names_resource_and_largest_node():
    static = ledger([Resources(cpu=8, gpu=1), Resources(cpu=4)])
    assert static.feasibility([Resources(cpu=1, gpu=8)]) == "needs 8 GPU per bundle; the largest node offers 1 GPU"
    scaling = ledger([Resources(cpu=2)], node_types=[Resources(cpu=16, gpu=1)])
    assert scaling.feasibility([Resources(cpu=1, gpu=1)]) is None        # the cluster can grow into it
    assert scaling.feasibility([Resources(cpu=1, gpu=8)]) == \
        "needs 8 GPU per bundle; the largest node type offers 1 GPU"
    assert "memory" in scaling.feasibility([Resources(cpu=1, memory=64 * GiB)])
    # Each resource exists somewhere, but never on one node together.
    mixed = ledger([Resources(cpu=8), Resources(cpu=1, gpu=1)])
    assert "no single node" in mixed.feasibility([Resources(cpu=4, gpu=1)])


def test_queue_reason_names_the_request_the_cluster_and_scale_up():
    led = ledger([Resources(cpu=8, gpu=2)], node_types=[Resources(cpu=8, gpu=2)])
    assert led.try_acquire("a", [Resources(cpu=1, gpu=2)])
    led.set_waiting("b", [Resources(cpu=1, gpu=1)])
    assert led.queue_reason("b") == ("waiting for 1 GPU of the cluster's 2: in use, or kept for requests ahead "
                                     "in line (fair sharing); scale-up requested")
    # more than the cluster has (it can grow into it, or feasibility failed the Experiment)
    no_scaling = ledger([Resources(cpu=2)])
    no_scaling.set_waiting("c", [cpu(4)])
    assert no_scaling.queue_reason("c") == "waiting for 4 CPU: the cluster has 2 CPU"
    empty = ledger([Resources(cpu=8)], node_types=[Resources(cpu=8, gpu=1)])
    empty.set_waiting("d", [Resources(cpu=1, gpu=1)])
    assert empty.queue_reason("d") == "waiting for 1 GPU: the cluster has 0 GPU; scale-up requested"


def test_autoscaler_request_includes_held_and_waiting():
    led = ledger([Resources(cpu=4, gpu=1)], node_types=[Resources(cpu=4, gpu=1)])
    assert led.try_acquire("a", [Resources(cpu=1, gpu=1)])
    led.set_waiting("b", [Resources(cpu=1, gpu=1)] * 2, priority=0)
    led.set_waiting("c", [Resources(cpu=2)], priority=5)
    assert led.waiting_bundles() == [Resources(cpu=2)] + [Resources(cpu=1, gpu=1)] * 2   # priority first
    assert led.autoscaler_request() == [Resources(cpu=1, gpu=1), Resources(cpu=2)] + [Resources(cpu=1, gpu=1)] * 2
    led.clear_waiting("b")
    assert led.waiting_bundles() == [Resources(cpu=2)]


def test_longest_waiting_gets_freed_resources_first():
    led = ledger([Resources(cpu=4, gpu=1)])
    assert led.try_acquire("running", [Resources(cpu=1, gpu=1)])
    led.set_waiting("exp-a/t0", [Resources(cpu=1, gpu=1)])
    led.set_waiting("exp-b/t0", [Resources(cpu=1, gpu=1)])
    led.release("running")
    # exp-b asks first after the release, but exp-a waited longer and fits now.
    assert not led.try_acquire("exp-b/t0", [Resources(cpu=1, gpu=1)])
    assert "kept for requests ahead in line" in led.queue_reason("exp-b/t0")
    assert led.try_acquire("exp-a/t0", [Resources(cpu=1, gpu=1)])
    assert not led.is_waiting("exp-a/t0")


def test_higher_priority_goes_first_and_unrelated_work_backfills():
    led = ledger([Resources(cpu=4, gpu=1)])
    assert led.try_acquire("gpu-user", [Resources(cpu=1, gpu=1)])
    led.set_waiting("low", [Resources(cpu=1, gpu=1)], priority=0)
    led.set_waiting("high", [Resources(cpu=1, gpu=1)], priority=10)
    assert led.blockers("low") == ["high"]
    # A CPU-only request behind a GPU-starved one may start: it takes nothing they need.
    assert led.try_acquire("cpu-only", [cpu(2)])
    # A new GPU request must not overtake the GPU-starved ones.
    assert not led.try_acquire("newcomer", [Resources(cpu=1, gpu=1)])
    led.release("gpu-user")
    assert not led.try_acquire("low", [Resources(cpu=1, gpu=1)])
    assert led.try_acquire("high", [Resources(cpu=1, gpu=1)], priority=10)


def test_adopt_records_running_trials_even_when_overcommitted():
    led = ledger([cpu(2)])
    led.adopt("a", [cpu(2)])
    led.adopt("b", [cpu(2)])      # the cluster shrank while the operator was down
    assert led.used() == cpu(4) and led.free() == Resources()
    led.release("a")
    led.release("b")
    assert led.free() == cpu(2)


def test_a_holding_adopted_where_nothing_was_free_is_placed_at_the_next_refresh_of_the_same_shape():
    """After a restart a running trial is adopted whatever the ledger thinks is free; once
    room frees, a refresh that reports the same cluster puts it on its node, so that room
    is not granted twice (a same-shape refresh must not skip the re-placing then)."""
    led = ResourceLedger()
    node = Resources(cpu=4.0)
    led.set_capacity(node, [node])
    assert led.try_acquire("a", [Resources(cpu=4.0)])
    led.adopt("b", [Resources(cpu=2.0)])           # running on the cluster; no room left on paper
    led.release("a")
    led.set_capacity(node, [node])                  # the 2 s refresh, same shape
    assert not led.try_acquire("c", [Resources(cpu=4.0)])
    assert led.try_acquire("d", [Resources(cpu=2.0)])
    assert led.free().cpu == 0.0


def test_a_woken_request_that_is_withdrawn_passes_its_turn_to_the_next():
    led = ResourceLedger()
    led.set_capacity(Resources(cpu=1.0), [Resources(cpu=1.0)])
    woken = []
    for experiment in ("ns/a/", "ns/b/"):
        led.watch(experiment, lambda e=experiment: woken.append(e))
    assert led.try_acquire("ns/x/t0", [Resources(cpu=1.0)])
    led.set_waiting("ns/a/t0", [Resources(cpu=1.0)])
    led.set_waiting("ns/b/t0", [Resources(cpu=1.0)])
    led.release("ns/x/t0")
    assert woken == ["ns/a/"]
    led.clear_waiting("ns/a/t0")                   # suspended before it took the slot
    assert woken == ["ns/a/", "ns/b/"]


def test_while_the_node_types_are_read_what_fits_starts_and_nothing_is_called_infeasible():
    ledger = ResourceLedger()
    ledger.set_capacity(Resources(cpu=2), [Resources(cpu=2)], None, growth_known=False)
    assert ledger.capacity_known and not ledger.growth_known and not ledger.autoscaling
    assert ledger.feasibility([Resources(cpu=1, gpu=1)]) is None      # the cluster may yet grow GPUs
    assert ledger.try_acquire("ns/e/t0", [Resources(cpu=1)])
    # node types given with growth unknown are not taken for known ones
    ledger.set_capacity(Resources(cpu=2), [Resources(cpu=2)], [Resources(cpu=4, gpu=1)], growth_known=False)
    assert ledger.node_shapes()[1] is None
    ledger.set_capacity(Resources(cpu=2), [Resources(cpu=2)], None)     # read: it cannot grow
    assert ledger.growth_known and ledger.holds("ns/e/t0")
    assert ledger.feasibility([Resources(cpu=1, gpu=1)]) == "needs 1 GPU per bundle; the largest node offers 0 GPU"
