"""Usage per attempt in the results store (issue 27): written from the Trial's
status.usage, read by ``kubetune results``, and added to a database created before
the table existed without touching its rows."""
from __future__ import annotations

import json

from sqlalchemy import create_engine

from kubetune.cli import main
from kubetune.controller.results_recorder import usage_rows
from kubetune.core.usage import TrialUsage
from kubetune.results import Batch, ExperimentRow, ResultRow, TrialRow, open_store
from kubetune.results import schema


def usage_after_a_retry() -> dict:
    usage = TrialUsage()
    usage.add_queue(12.0)
    usage.observe(0, 1000.0, None, gpus=1, cpus=2)
    usage.saw(0, 1030.0)
    usage.observe(1, 1100.0, 1150.0, gpus=1, cpus=2, ended=True)    # attempt 0 ended at 1030
    return usage.to_status()


def test_a_database_from_before_the_usage_table_gains_it_and_keeps_its_rows(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old_tables = [table for name, table in schema.metadata.tables.items() if name != "kubetune_usage"]
    engine = create_engine(url)
    schema.metadata.create_all(engine, tables=old_tables)
    engine.dispose()
    store = open_store(url)
    store.write(Batch(experiments=[ExperimentRow("e1", "ml", "gpu-run", metric="loss", mode="min")],
                      trials=[TrialRow("t1", "e1", "gpu-run-0")],
                      results=[ResultRow("t1", 0, 1, {"loss": 0.5}, time=1030.0, attempt=0)]))
    status = usage_after_a_retry()
    # the write before the retry showed attempt 0 running; the next both attempts' ends
    assert [run["attempt"] for run in status["endedRuns"]] == [0, 1]
    store.write(Batch(usage=usage_rows("t1", {"currentRun": {**status["endedRuns"][0], "seenAt": 1010.0}})))
    store.write(Batch(usage=usage_rows("t1", status)))
    store.close()

    assert main(["results", "gpu-run", "-n", "ml", "--store", url, "-o", "json"]) == 0
    trial = json.loads(capsys.readouterr().out)["trials"][0]
    assert [(u["attempt"], u["run_seconds"], u["gpu_seconds"], u["cpu_seconds"], u["ended"]) for u in trial["usage"]] \
        == [(0, 30.0, 30.0, 60.0, 1030.0), (1, 50.0, 50.0, 100.0, 1150.0)]
    assert trial["usage"][0]["queue_seconds"] == 12.0
    assert main(["results", "gpu-run", "-n", "ml", "--store", url]) == 0
    table = capsys.readouterr().out
    assert "USAGE PER ATTEMPT" in table and "total: 0.02222 GPU-hours" in table


def test_prometheus_counters_count_increments_not_the_total_a_restart_restores():
    from kubetune import metrics
    from kubetune.controller.usage_metrics import UsageCounters

    def exported() -> float:
        return metrics.REGISTRY.get_sample_value("kubetune_gpu_seconds_total",
                                                 {"namespace": "ml", "experiment": "counted"}) or 0.0
    before = exported()
    restarted = UsageCounters("ml", "counted")
    restarted.export({"gpuSeconds": 500.0, "cpuSeconds": 100.0, "runSeconds": 500.0, "queueSeconds": 3.0})
    assert exported() == before            # what the last operator counted is the baseline
    restarted.export({"gpuSeconds": 530.0, "cpuSeconds": 130.0, "runSeconds": 530.0, "queueSeconds": 3.0})
    assert exported() == before + 30.0
    assert metrics.REGISTRY.get_sample_value("kubetune_queue_seconds_total",
                                             {"namespace": "ml", "experiment": "counted"}) in (None, 0.0)


def test_a_pod_trials_run_is_its_containers_start_and_end_on_the_kubelets_clock():
    from kubetune.executors.pods.spec import run_times
    running = {"status": {"containerStatuses": [{"state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}}]}}
    ended = {"status": {"containerStatuses": [{"state": {"terminated": {
        "startedAt": "2026-01-01T00:00:10Z", "finishedAt": "2026-01-01T00:01:40Z", "exitCode": 0}}}]}}
    started, _ = run_times(running)
    assert run_times(running)[1] is None and run_times({"status": {}}) == (None, None)
    assert run_times(ended) == (started, started + 90)
