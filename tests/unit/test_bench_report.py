"""The benchmark's arithmetic: per-run metrics, medians, ratios, targets and the table."""
from __future__ import annotations

import pytest

from kubetune.bench import report
from kubetune.bench.__main__ import summarize
from kubetune.bench.kube import count_delta, parse_write_counts
from kubetune.bench.workloads import workloads


def test_tiny_metrics_and_ratio_of_medians():
    kubetune = [{"makespan_s": 10.0, "trials_done": 200, "results": 2000},
                {"makespan_s": 5.0, "trials_done": 200, "results": 2000},
                {"makespan_s": 8.0, "trials_done": 200, "results": 2000}]
    raytune = [{"makespan_s": 200.0, "trials_done": 200, "results": 2000}]
    runs = {"tiny": {"kubetune": kubetune, "raytune": raytune}}
    summary = summarize(runs, workloads())["tiny"]
    assert summary["kubetune"]["trials_per_s"] == pytest.approx(25.0)      # median of 20, 40, 25
    assert summary["kubetune"]["results_per_s"] == pytest.approx(250.0)
    assert summary["raytune"]["trials_per_s"] == pytest.approx(1.0)
    assert summary["ratio_trials"] == pytest.approx(25.0)
    assert summary["ratio_trials_reuse"] is None                            # not run
    assert report.meets("tiny_ratio", summary["ratio_trials"]) is True
    assert report.meets("tiny_ratio", 9.9) is False


def test_failed_runs_are_left_out_of_the_medians():
    runs = {"tiny": {"kubetune": [{"error": "exit 1"}, {"makespan_s": 4.0, "trials_done": 8, "results": 80}]}}
    assert summarize(runs, workloads())["tiny"]["kubetune"]["trials_per_s"] == pytest.approx(2.0)


def test_efficiency_is_ideal_over_actual_and_ramp_up_is_excluded_from_slot_use():
    # 4 trials of 1 s on 2 slots: ideal 2 s; slot 1 starts at 0, slot 2 only at 1 (a slow
    # worker start); after that both slots are always busy
    rate = 10.0
    def trial(start):     # due times of 10 reports at 10/s from ``start``
        return [start + step / rate for step in range(1, 11)]
    run = {"started": 0.0, "makespan_s": 4.0,
           "offered_at": [trial(0.0), trial(1.0), trial(1.0), trial(2.0)]}
    m = report.efficiency_metrics(run, trials=4, trial_seconds=1.0, slots=2, rate=rate)
    assert m["ideal_s"] == pytest.approx(2.0)
    assert m["efficiency"] == pytest.approx(0.5)
    assert m["first_start_s"] == pytest.approx(0.0)
    # window [1, 3]: trials [1,2], [1,2], [2,3] fill 3 of its 4 slot-seconds
    assert m["busy_after_rampup"] == pytest.approx(0.75)


def test_throughput_compares_the_offered_window_with_the_processed_one():
    offered = [[1.0 + i / 20 for i in range(1, 21)] for _ in range(2)]   # 2 trials, 20 results in 1 s
    run = {"offered_at": offered, "results": 40, "makespan_s": 3.0, "last_processed": 1.0 + 1.0 + 0.95,
           "lags": [0.1] * 39 + [1.0]}
    m = report.throughput_metrics(run, nominal_rate=40.0)
    assert m["processed_over_offered"] == pytest.approx(0.95 / 1.9)      # fell 0.95 s behind a 0.95 s window
    assert m["offered_per_s"] == pytest.approx(40 / 0.95)
    assert m["processed_per_s"] == pytest.approx(40 / 1.9)
    assert m["lag_p50_s"] == pytest.approx(0.1)
    # a downsampled curve (kubetune's history) keeps its ends: the rate counts every result
    thinned = dict(run, offered_at=[times[::4] + [times[-1]] for times in offered])
    assert report.throughput_metrics(thinned, nominal_rate=40.0)["offered_per_s"] == pytest.approx(40 / 0.95)
    keeping_up = dict(run, last_processed=2.0)       # held the last result when it was due
    assert report.throughput_metrics(keeping_up, nominal_rate=40.0)["processed_over_offered"] == pytest.approx(1.0)


def test_percentile_interpolates():
    assert report.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == pytest.approx(2.5)
    assert report.percentile([5.0], 0.99) == 5.0
    assert report.percentile([], 0.5) is None


def test_api_writes_are_parsed_by_verb_and_resource_and_counted_per_result():
    metrics = "\n".join([
        '# TYPE apiserver_request_total counter',
        'apiserver_request_total{code="201",component="apiserver",dry_run="",group="kubetune.dev",resource="trials",'
        'scope="resource",subresource="",verb="POST",version="v1alpha1"} 10',
        'apiserver_request_total{code="200",component="apiserver",dry_run="",group="kubetune.dev",resource="trials",'
        'scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 20',
        'apiserver_request_total{code="409",component="apiserver",dry_run="",group="kubetune.dev",resource="trials",'
        'scope="resource",subresource="status",verb="PATCH",version="v1alpha1"} 1',
        'apiserver_request_total{code="200",component="apiserver",dry_run="",group="kubetune.dev",resource="trials",'
        'scope="namespace",subresource="",verb="LIST",version="v1alpha1"} 99',
        'apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",'
        'scope="resource",subresource="",verb="POST",version="v1"} 5',
        'apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",'
        'resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 7',
    ])
    after = parse_write_counts(metrics)
    assert after == {"trials POST": 10, "trials/status PATCH": 21, "events POST": 5}
    writes = count_delta({"trials POST": 4, "events POST": 5}, after)
    assert writes == {"trials POST": 6, "trials/status PATCH": 21}
    m = report.kube_metrics({"writes": {**writes, "events POST": 3}, "results": 270, "experiment_bytes": 4096,
                             "operator_peak_kib": 2048, "trials_done": 6, "makespan_s": 3.0})
    assert m["writes_per_result"] == pytest.approx(27 / 270)
    assert m["writes_per_result_with_events"] == pytest.approx(30 / 270)
    assert m["operator_peak_mib"] == pytest.approx(2.0)
    assert report.meets("writes_per_result", m["writes_per_result"]) is True
    assert report.meets("experiment_bytes_1000", 16 * 1024 + 1) is False


def test_table_shows_every_measured_workload_and_its_target():
    runs = {
        "tiny": {"kubetune": [{"makespan_s": 5.0, "trials_done": 200, "results": 2000}],
                 "raytune": [{"makespan_s": 200.0, "trials_done": 200, "results": 2000}]},
        "core": {"core": [{"decisions": 1000, "seconds": 0.5, "events": 3000, "trials": 100}]},
    }
    rows = report.summary_rows(summarize(runs, workloads()))
    text = report.text_table(rows)
    assert "1. Tiny trials" in text and "40.0×" in text and ">= 10.0: met" in text
    assert "5. Core only" in text and "2,000" in text
    markdown = report.markdown({"command": "python -m kubetune.bench", "repeats": 1, "quick": False, "wall_s": 60,
                                "machine": {"cpus": 2, "memory_gib": 8.0, "os": "Linux", "python": "3.11",
                                            "ray": "2.60.0", "kubetune": "0.1.0", "git_commit": "abc"}}, rows)
    assert "| 1. Tiny trials" in markdown and "`python -m kubetune.bench`" in markdown


def test_ceiling_is_a_list_schedule_on_slots_opening_late():
    # 2 slots, one up at 0 s, one at 3 s; 4 trials of 2 s: the first slot runs trials at
    # 0, 2 and 4 (ends 6), the second one at 3 (ends 5): makespan 6, not 4
    assert report.ceiling_makespan([0.0, 3.0], trials=4, trial_seconds=2.0) == 6.0
    # every slot up at once: the ideal
    assert report.ceiling_makespan([0.0] * 16, trials=400, trial_seconds=1.0) == 25.0
    figures = report.floor_metrics({"slot_ready_s": [0.0, 3.0]}, trials=4, trial_seconds=2.0, slots=2)
    assert figures["efficiency"] == 4.0 / 6.0
    assert (figures["first_slot_s"], figures["last_slot_s"]) == (0.0, 3.0)
