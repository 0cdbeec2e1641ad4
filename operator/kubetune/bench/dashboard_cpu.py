"""``python -m kubetune.bench.dashboard_cpu --store URL``: the CPU a first opening of the
10,000-trial Experiment costs the dashboard with nothing kept, by stage, in one process.

``kubetune.bench.dashboard`` times openings over HTTP on a new process: on this shared
2-core machine those wall times mostly say how busy the machine was.  CPU time
(``time.process_time``) says what the code costs.  Each repeat makes a new storage and
app over the store (nothing kept, no warm-up) and times: the storage's first read (trial
rows, result counts, compact curves: ``get_all_trials``), then the study-detail
response (``/api/studies/<id>?after=0`` through the WSGI app, no socket), and within
it, separately, the trials' JSON, the search spaces and the Pareto front.  Uses the
store ``kubetune.bench.dashboard`` builds (``--store``)."""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

from kubetune.bench.dashboard import BENCH_UID, built
from kubetune.bench.machine import commit_label


def cpu(work: Callable[[], Any]) -> tuple[float, float, Any]:
    """(CPU seconds, wall seconds, result)."""
    wall, started = time.perf_counter(), time.process_time()
    result = work()
    return time.process_time() - started, time.perf_counter() - wall, result


def get(app, path: str, query: str) -> tuple[str, bytes]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "SERVER_NAME": "bench",
               "SERVER_PORT": "80", "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr, "wsgi.url_scheme": "http"}
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], body


def one_cold_open(url: str) -> dict[str, float]:
    from kubetune.dashboard import dashboard_compat as odc
    from kubetune.dashboard.server import make_app
    from kubetune.dashboard.storage import ResultsStoreStorage, study_id_of
    from kubetune.results import open_store

    storage = ResultsStoreStorage(open_store(url, read_only=True))
    try:
        app, study_id = make_app(storage, warm=False), study_id_of(BENCH_UID)
        figures: dict[str, float] = {}
        figures["storage_read_cpu"], figures["storage_read_wall"], trials = cpu(
            lambda: storage.get_all_trials(study_id, deepcopy=False))
        figures["response_cpu"], figures["response_wall"], (status, body) = cpu(
            lambda: get(app, f"/api/studies/{study_id}", "after=0"))
        if not status.startswith("200"):
            raise RuntimeError(f"the study-detail API answered {status}")
        figures["body_mb"] = len(body) / 1e6
        # the response's parts again, each alone (the pieces kept by the response are not used)
        try:
            from kubetune.dashboard.study_extras import extra_study_property
            from kubetune.dashboard.trial_json import TrialEncoder
        except ImportError:   # an older kubetune run with this file (a before/after comparison): totals only
            return figures
        study = odc.get_study(storage, study_id)
        encoder = TrialEncoder(study_id, study.system_attrs)
        figures["trials_json_cpu"] = cpu(lambda: [encoder.encode(t) for t in trials])[0]
        figures["search_spaces_cpu"] = cpu(lambda: extra_study_property(study_id, trials))[0]
        figures["pareto_front_cpu"] = cpu(lambda: odc.get_pareto_front_trials(trials=trials,
                                                                              directions=study.directions))[0]
        return figures
    finally:
        storage.store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.dashboard_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store kubetune.bench.dashboard built (its --store)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if not built(args.store, 10_000, 100):
        raise SystemExit(f"{args.store} does not hold the benchmark's Experiment: run kubetune.bench.dashboard first")
    load_before = os.getloadavg()[0]
    runs = [one_cold_open(args.store) for _ in range(args.repeats)]
    medians = {key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]}
    figures = {"commit": commit_label(), "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
               "median": medians, "runs": runs}
    print(f"first opening with nothing kept, 10,000 trials x 100 results, CPU seconds (median of {args.repeats}); "
          f"commit {figures['commit']}, load {figures['load_before']} -> {figures['load_after']}")
    print(f"  storage's first read {medians['storage_read_cpu']:.2f} s + study-detail response "
          f"{medians['response_cpu']:.2f} s = {medians['storage_read_cpu'] + medians['response_cpu']:.2f} s "
          f"(wall {medians['storage_read_wall'] + medians['response_wall']:.2f} s; body {medians['body_mb']:.1f} MB)")
    if "trials_json_cpu" in medians:
        print(f"  within the response: trials' JSON {medians['trials_json_cpu']:.2f} s, search spaces "
              f"{medians['search_spaces_cpu']:.2f} s, Pareto front {medians['pareto_front_cpu']:.2f} s")
    if args.out:
        with open(args.out, "w") as file:
            json.dump(figures, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
