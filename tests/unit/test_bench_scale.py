"""The scale benchmark's pure parts: fair shares, starvation counts, the apiserver's
metrics and the Experiment bodies (kubetune.bench.scale)."""
import json
import math

import pytest

from kubetune.bench.scale import apimetrics, fairness, shapes


def runs(key, applied, spans, parallelism=1, group="ns"):
    return fairness.Runs(key, group, applied, parallelism, tuple(spans))


def test_water_fill_gives_nobody_more_than_it_asks_and_shares_the_rest():
    assert fairness.water_fill(6, {"a": 1, "b": 4, "c": 4}) == {"a": 1, "b": 2.5, "c": 2.5}
    assert fairness.water_fill(2, {"a": 2, "b": 2}) == {"a": 1, "b": 1}
    assert fairness.water_fill(10, {"a": 1}) == {"a": 1}


def test_two_experiments_taking_turns_on_one_slot_get_about_their_fair_share():
    a = runs("a", 0, [(2 * i, 2 * i + 1) for i in range(20)])
    b = runs("b", 0, [(2 * i + 1, 2 * i + 2) for i in range(20)])
    computed = fairness.shares([a, b])
    # one slot in use throughout, half each while both wait (the last trial of the one
    # that finishes first runs while the other waits: a little under 1)
    assert computed.share("a") == pytest.approx(1.0, abs=0.05)
    assert computed.share("b") == pytest.approx(1.0, abs=0.05)


def test_an_experiment_kept_waiting_while_another_runs_has_a_share_near_zero():
    hog = runs("hog", 0, [(i, i + 1) for i in range(10)])
    starved = runs("starved", 0, [(10, 11)])
    summary = fairness.summarize([hog, starved], fairness.shares([hog, starved]))
    assert summary["slowest_experiment"] == "starved"
    assert summary["slowest_share"] == pytest.approx(0.0)
    assert summary["experiments"]["hog"] > 1.5


def test_starvation_counts_other_experiments_completions_while_one_waits():
    hog = runs("hog", 0, [(i, i + 1) for i in range(10)])
    starved = runs("starved", 0, [(10, 11)])
    assert fairness.starvation([hog, starved]) == {"hog": 0, "starved": 10}


def test_starvation_does_not_count_while_an_experiment_runs_all_it_may():
    # b runs its one allowed trial while a's complete: b is not deprived then
    a = runs("a", 0, [(0, 1), (1, 2), (2, 3)])
    b = runs("b", 0, [(0, 3), (3, 4)])
    assert fairness.starvation([a, b])["b"] == 0


def test_starvation_starts_counting_at_the_apply():
    early = runs("early", 0, [(i, i + 1) for i in range(5)])
    late = runs("late", 4.5, [(5, 6)])
    assert fairness.starvation([early, late])["late"] == 1     # only early's completion at 5


METRICS = """\
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="",verb="POST",version="v1alpha1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 30
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 99
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="status",verb="PATCH",version="v1alpha1",le="0.1"} 20
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="status",verb="PATCH",version="v1alpha1",le="1"} 30
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="status",verb="PATCH",version="v1alpha1",le="+Inf"} 30
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 6
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="kubetune.dev",resource="trials",scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 30
# TYPE apiserver_storage_size_bytes gauge
apiserver_storage_size_bytes{storage_cluster_id="x"} 2048
"""


def test_apiserver_metrics_by_resource_and_verb_with_latency_quantiles():
    snap = apimetrics.parse(METRICS)
    assert snap.requests == {"trials POST": 10, "trials/status PATCH": 30}
    assert snap.storage_bytes == 2048
    lat = apimetrics.latency(snap)["PATCH"]
    assert lat["requests"] == 30 and lat["mean_s"] == pytest.approx(0.2)
    assert lat["p50_s"] == pytest.approx(0.075)          # rank 15 of the 20 under 0.1
    assert lat["p95_s"] == pytest.approx(0.1 + 0.9 * (28.5 - 20) / 10)
    used = apimetrics.delta(apimetrics.parse(""), snap)
    assert apimetrics.minus_own(used.requests, {"trials POST": 10}) == {"trials/status PATCH": 30}
    assert apimetrics.by_verb(used.requests) == {"PATCH": 30, "POST": 10}


def test_many_spreads_experiments_over_namespaces_and_bodies_ask_what_was_planned():
    planned = shapes.many(experiments=10, namespaces=4, trials=5, reports=2, parallelism=2, cpu=0.05)
    assert [p.namespace for p in planned[:5]] == ["scale-00", "scale-01", "scale-02", "scale-03", "scale-00"]
    assert len({p.key for p in planned}) == 10
    body = planned[0].body("/tmp/runs")
    assert body["spec"]["budget"] == {"maxTrials": 5, "parallelism": 2}
    assert body["spec"]["trial"]["resources"] == {"cpu": 0.05}
    assert body["spec"]["trial"]["config"] == {"reports": 2, "runs_dir": "/tmp/runs"}
    assert not math.isnan(planned[0].cpu)


def test_fair_shares_are_split_between_namespaces_first():
    demands = {"a/1": 2, "a/2": 2, "a/3": 2, "b/big": 32}
    groups = {k: k.split("/")[0] for k in demands}
    split = fairness.fair_split(12, demands, groups)
    assert split == {"a/1": 2, "a/2": 2, "a/3": 2, "b/big": 6}
    assert fairness.fair_split(4, demands, groups) == {"a/1": 2 / 3, "a/2": 2 / 3, "a/3": 2 / 3, "b/big": 2}


def test_the_get_trials_bench_builds_the_status_the_operator_writes_for_a_finished_trial():
    from kubetune.bench.scale.finished_trial import finished_status, trial_body
    from kubetune.controller import render
    from kubetune.core.curve import CURVE_POINTS
    spec = shapes.big(trials=10, parallelism=2, cpu=0.05).body()["spec"]
    one, hundred = finished_status(spec, 1), finished_status(spec, 100)
    assert (one["phase"], one["lastResultSeq"], one["iteration"]) == ("Succeeded", 0, 1)
    assert (hundred["phase"], hundred["lastResultSeq"], hundred["iteration"]) == ("Succeeded", 99, 100)
    # the curve is the bounded one (core/curve.py), and the run's end is counted
    assert len(hundred["history"]) <= CURVE_POINTS < 100
    assert hundred["usage"]["runSeconds"] > 0 and hundred["usage"]["endedRuns"]
    # what a restarted operator reads back from it
    assert render.trial_record({"metadata": {"name": "big-0"}, "spec": {"index": 0}, "status": hundred}).phase.value \
        == "Succeeded"
    experiment = {"metadata": {"name": "big", "uid": "u"}, "spec": spec}
    body = trial_body("ns", experiment, 7, 0.5)
    assert body["metadata"]["name"] == "big-7" and body["spec"]["index"] == 7
    assert body["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_the_ledger_bench_times_a_full_cluster_with_the_requests_it_says(capsys):
    from kubetune.bench.scale import ledger as ledger_bench
    assert ledger_bench.main(["--experiments", "20", "--namespaces", "4", "--big", "4", "--slots", "8",
                              "--repeat", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["waiting"] == 20 * 2 + 4 - 8 and out["experiments"] == 21
    assert out["rebuild_ms"] > 0 and out["turnover_ms"] > 0
