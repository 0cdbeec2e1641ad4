"""``python -m kubetune.bench.dashboard``: how long the dashboard takes to open an
Experiment of 10,000 trials x 100 results (issue 30's target: <= 2 s).

The Experiment (two objectives, one constraint, three parameters; every result
reports the three metrics) is written into a results store through ``ResultsStore.write``,
then ``kubetune dashboard``'s app (optuna-dashboard over ``ResultsStoreStorage``) is
served on a local port, and the time to open the study's page is the time of its
requests over HTTP: the page itself and ``/api/studies/<id>`` (every trial with its
intermediate values, the Pareto front), from a cold dashboard (a new process-level
storage: nothing cached) and warm (the dashboard's next poll).

The peer, measured in the same run: optuna-dashboard over Optuna's InMemoryStorage
holding the same trials (no database at all: the floor of the dashboard's own work).
``--rdb-peer`` adds Optuna's RDBStorage (SQLite) holding them, what optuna-dashboard
reads when Optuna writes its own database (slow to build: a minute or more)."""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

TRIALS, RESULTS = 10_000, 100
BENCH_UID = "bench-dashboard-uid"


def built(url: str, trials: int, results: int) -> bool:
    """The Experiment is in the store already at this size (``--store`` reused)."""
    from kubetune.results import open_store
    try:
        store = open_store(url, read_only=True)
    except FileNotFoundError:
        return False
    try:
        stats = store.result_stats(BENCH_UID)
        return len(stats) == trials and all(count == results for count, _, _ in stats.values())
    finally:
        store.close()


def build(url: str, trials: int, results: int, seed: int = 0) -> str:
    """Write the Experiment; returns its UID."""
    from kubetune.results.study_meta import study_json
    from kubetune.results import Batch, ExperimentRow, ResultRow, TrialRow, open_store
    from kubetune.spec.model import Constraint
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    rng = random.Random(seed)
    store = open_store(url)
    uid = BENCH_UID
    study = study_json([("loss", "min"), ("latency_ms", "min")], [Constraint("memory_gb", max=2.0)],
                       {"lr": FloatDistribution(1e-5, 1e-1, log=True), "layers": IntDistribution(1, 8),
                        "opt": CategoricalDistribution(["adam", "sgd"])})
    store.write(Batch(experiments=[ExperimentRow(uid, "bench", "big", "loss", "min", "Succeeded", time.time(),
                                                 study)]))
    started = time.monotonic()
    per_batch = max(1, 20_000 // results)
    for first in range(0, trials, per_batch):
        batch = Batch()
        for i in range(first, min(trials, first + per_batch)):
            lr, layers = 10 ** rng.uniform(-5, -1), rng.randint(1, 8)
            tuid = f"{uid}-t{i}"
            batch.trials.append(TrialRow(tuid, uid, f"big-{i}", i, {"lr": lr, "layers": layers,
                                                                   "opt": rng.choice(["adam", "sgd"])},
                                         "Succeeded" if i % 10 else "Stopped", "", None, results - 1, 0))
            floor = rng.uniform(0.05, 0.5) + abs(math.log10(lr) + 3) * 0.05
            for step in range(results):
                loss = floor + 2.0 / (1 + step) + rng.gauss(0, 0.01)
                batch.results.append(ResultRow(tuid, step, step, {
                    "loss": loss, "latency_ms": 5.0 * layers + rng.gauss(0, 0.5),
                    "memory_gb": 0.3 * layers}, time=1.7e9 + i + step * 0.01, attempt=0))
        store.write(batch)
        done = min(trials, first + per_batch)
        rate = done * results / max(time.monotonic() - started, 1e-9)
        print(f"\r  written {done}/{trials} trials ({rate:,.0f} results/s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    store.close()
    return uid


def serve(storage) -> tuple[str, Callable[[], None]]:
    """optuna-dashboard's app over ``storage`` on a local port: (base URL, stop)."""
    from kubetune.dashboard.server import make_server
    server = make_server(storage, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
    return f"http://127.0.0.1:{server.server_port}", stop


def open_page(base: str, study_id: int) -> tuple[float, dict[str, Any]]:
    """Seconds to get the study's page and its data, and the data."""
    started = time.perf_counter()
    with urllib.request.urlopen(f"{base}/dashboard/studies/{study_id}", timeout=600) as response:
        response.read()
    with urllib.request.urlopen(f"{base}/api/studies/{study_id}", timeout=600) as response:
        data = json.loads(response.read())
    return time.perf_counter() - started, data


def measure(make_storage: Callable[[], Any], study_id_of: Callable[[Any], int], repeats: int) -> dict[str, Any]:
    cold, warm, data = [], [], {}
    for _ in range(repeats):
        storage = make_storage()
        base, stop = serve(storage)
        try:
            study_id = study_id_of(storage)
            seconds, data = open_page(base, study_id)
            cold.append(seconds)
            time.sleep(1.1)          # past the storages' revalidation interval: a real revalidation
            warm.append(open_page(base, study_id)[0])
        finally:
            stop()
    return {"cold_s": statistics.median(cold), "warm_s": statistics.median(warm), "cold_all": cold,
            "trials": len(data.get("trials", [])), "best_trials": len(data.get("best_trials", [])),
            "intermediate_values": sum(len(t["intermediate_values"]) for t in data.get("trials", []))}


def peer_trials(store_url: str, uid: str) -> tuple[list, list]:
    """The same trials as frozen trials (read once through our storage), and directions."""
    from kubetune.dashboard.storage import ResultsStoreStorage
    from kubetune.results import open_store
    storage = ResultsStoreStorage(open_store(store_url, read_only=True))
    study_id = next(iter(storage.studies()))
    return storage.get_all_trials(study_id, deepcopy=True), storage.get_study_directions(study_id)


def optuna_storage(storage, trials: list, directions: list):
    study_id = storage.create_new_study(directions, study_name="bench/big")
    for trial in trials:
        storage.create_new_trial(study_id, template_trial=trial)
    return storage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=TRIALS)
    parser.add_argument("--results", type=int, default=RESULTS, help="results per trial")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--store", default="", help="results store URL (default: a new SQLite file in a temp dir); "
                        "a store holding the benchmark's Experiment at this size is reused")
    parser.add_argument("--rdb-peer", action="store_true", help="also measure Optuna's RDBStorage (SQLite)")
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    import optuna
    from kubetune.dashboard.storage import ResultsStoreStorage
    from kubetune.results import open_store
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="kt-bench-dashboard-") as tmp:
        url = args.store or f"sqlite:///{tmp}/results.db"
        started = time.monotonic()
        if built(url, args.trials, args.results):
            uid = BENCH_UID
            print(f"reusing {args.trials} trials x {args.results} results in {url}", file=sys.stderr)
        else:
            print(f"building {args.trials} trials x {args.results} results in {url}", file=sys.stderr)
            uid = build(url, args.trials, args.results)
        figures: dict[str, Any] = {"trials": args.trials, "results_per_trial": args.results,
                                   "build_s": round(time.monotonic() - started, 1)}
        figures["kubetune"] = measure(
            lambda: ResultsStoreStorage(open_store(url, read_only=True)),
            lambda storage: next(iter(storage.studies())), args.repeats)
        trials, directions = peer_trials(url, uid)
        figures["optuna_inmemory"] = measure(
            lambda: optuna_storage(optuna.storages.InMemoryStorage(), trials, directions),
            lambda storage: storage.get_all_studies()[0]._study_id, args.repeats)
        if args.rdb_peer:
            rdb_url = f"sqlite:///{tmp}/optuna.db"
            print("building Optuna's RDBStorage peer", file=sys.stderr)
            optuna_storage(optuna.storages.RDBStorage(rdb_url), trials, directions)
            figures["optuna_rdb"] = measure(lambda: optuna.storages.RDBStorage(rdb_url),
                                            lambda storage: storage.get_all_studies()[0]._study_id, args.repeats)
    ours = figures["kubetune"]
    print(f"\nkubetune dashboard, {args.trials} trials x {args.results} results "
          f"({ours['trials']} trials, {ours['intermediate_values']} intermediate values, "
          f"{ours['best_trials']} on the Pareto front served)")
    print(f"  open, cold: {ours['cold_s']:.2f} s (median of {args.repeats}; target <= 2 s)   "
          f"next poll: {ours['warm_s']:.2f} s")
    for peer in ("optuna_inmemory", "optuna_rdb"):
        if peer in figures:
            theirs = figures[peer]
            print(f"  peer {peer}: cold {theirs['cold_s']:.2f} s, poll {theirs['warm_s']:.2f} s; "
                  f"kubetune / peer (cold): {ours['cold_s'] / theirs['cold_s']:.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0 if ours["trials"] == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
