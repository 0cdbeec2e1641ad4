"""``python -m kubetune.bench.dashboard``: how long the dashboard takes to open an
Experiment of 10,000 trials x 100 results (issue 30's target: <= 2 s).

The Experiment (two objectives, one constraint, three parameters; every result
reports the three metrics) is written into a results store through ``ResultsStore.write``,
then ``kubetune dashboard``'s app (optuna-dashboard over ``ResultsStoreStorage``, its
study-detail API answered by ``dashboard.detail``) is served on a local port, and the
time to open the study's page is the time of a browser's requests over HTTP, made from
another process (``http_fetch``): the page, the dashboard's meta and study list, and
``/api/studies/<id>?after=0`` (every trial with its intermediate values, the Pareto
front) to its last byte.  Cases: the first opening on a ``kubetune dashboard`` process
just started (as a user or the chart's Pod starts it, the moment it listens), with
nothing kept on disk and with the page data its previous run kept (``--cache-dir``:
dashboard/snapshot.py); then, in-process, the warm-up a dashboard does at start; an
opening after it; the page's poll; another opening; an opening after a pause with
nobody looking; and one with the kept body made stale (what an opening waits for when
the keeper falls behind).

The peer, measured in the same run: optuna-dashboard over Optuna's InMemoryStorage
holding the same trials (no database at all: the floor of the dashboard's own work).
``--rdb-peer`` adds Optuna's RDBStorage (SQLite) holding them, what optuna-dashboard
reads when Optuna writes its own database (slow to build: a minute or more)."""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from kubetune.bench.machine import commit_label

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


def serve(storage, *, warm: bool = True):
    """optuna-dashboard's app over ``storage`` on a local port, kubetune's routes added
    (``warm``: its warm-up started): (base URL, app, stop)."""
    from kubetune.dashboard.server import make_server
    server = make_server(storage, "127.0.0.1", 0, warm=warm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.get_app().kubetune_details.stop()   # its keeper would compete with the next measurement
        server.shutdown()
        server.server_close()
    return f"http://127.0.0.1:{server.server_port}", server.get_app(), stop


def serve_plain(storage):
    """optuna-dashboard's own app, as ``optuna-dashboard`` serves it (the peer)."""
    import optuna_dashboard
    from kubetune.dashboard.server import _QuietHandler, _ThreadingServer
    from wsgiref.simple_server import make_server
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(storage), server_class=_ThreadingServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
    return f"http://127.0.0.1:{server.server_port}", server.get_app(), stop


class Browser:
    """Fetches as a browser opening a page would, from another process (``http_fetch``)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "kubetune.bench.http_fetch"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def fetch(self, *urls: str) -> dict[str, Any]:
        self.process.stdin.write(json.dumps(list(urls)) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def open_page(self, base: str, study_id: int) -> tuple[float, dict[str, Any]]:
        """Seconds to get what a browser fetches to open the study's page (the page, the
        dashboard's meta and study list, the study with every trial: ``after`` 0, to its
        last byte; its bundle.js is cached), and a summary of the study."""
        got = self.fetch(f"{base}/dashboard/studies/{study_id}", f"{base}/api/meta", f"{base}/api/studies",
                         f"{base}/api/studies/{study_id}?after=0")
        return got["seconds"], got

    def poll(self, base: str, study_id: int, after: int) -> float:
        """Seconds of the page's live-update poll (``after``: its first unfinished trial)."""
        return self.fetch(f"{base}/api/studies/{study_id}?after={after}")["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def expire_trial_lists(app) -> None:
    """Forget the dashboard's own trial lists (what its 2-10 s TTL does), so the next
    open asks the storage again, as one arriving later would (no waiting in a benchmark)."""
    from kubetune.dashboard import dashboard_compat
    dashboard_compat.app_cache(app).clear()


class Process:
    """``kubetune dashboard --store URL --port 0 --cache-dir DIR`` as a new process."""

    def __init__(self, url: str, cache_dir: str) -> None:
        started = time.perf_counter()
        self.process = subprocess.Popen([sys.executable, "-m", "kubetune", "dashboard", "--store", url, "--port", "0",
                                         "--cache-dir", cache_dir], stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()   # printed once it listens
        match = re.search(r"(http://\S+?)/dashboard", line)
        if not match:
            self.stop()
            raise RuntimeError(f"kubetune dashboard printed no address: {line!r}")
        self.base, self.listening = match.group(1), time.perf_counter() - started

    def cpu(self) -> float:
        """CPU seconds the process used so far (Linux; NaN elsewhere): what an opening costs
        it, which the load of a shared machine inflates far less than the wall time."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return math.nan
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def wait_kept(cache: str, timeout_s: float = 900.0) -> None:
    """Until the dashboard has kept a study's page data in ``cache`` (its keeper writes it a
    round after its warm-up)."""
    deadline = time.monotonic() + timeout_s
    while not any(Path(cache).glob("*.study")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard kept no page data within {timeout_s / 60:.0f} minutes")
        time.sleep(0.5)


def measure_restarts(browser: Browser, url: str, study_id: int, repeats: int) -> dict[str, Any]:
    """Per repeat, in a new cache directory: a new process and its first opening at once
    (nothing kept: it waits for the trials read from the store), then, once that process
    has kept the page data, another new process and its first opening (the restart)."""
    runs: dict[str, list[float]] = {k: [] for k in ("listen", "first_nothing_kept", "first_nothing_kept_cpu",
                                                    "first_kept")}
    data: dict[str, Any] = {}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kt-bench-dashboard-cache-") as cache:
            process = Process(url, cache)
            try:
                runs["listen"].append(process.listening)
                before = process.cpu()
                runs["first_nothing_kept"].append(browser.open_page(process.base, study_id)[0])
                runs["first_nothing_kept_cpu"].append(process.cpu() - before)
                wait_kept(cache)
            finally:
                process.stop()
            process = Process(url, cache)
            try:
                runs["listen"].append(process.listening)
                seconds, data = browser.open_page(process.base, study_id)
                runs["first_kept"].append(seconds)
            finally:
                process.stop()
    return summary(runs, data)


def measure_kubetune(browser: Browser, make_storage: Callable[[], Any], repeats: int,
                     pause: float) -> dict[str, Any]:
    """Per repeat, a new dashboard (in-process, nothing kept on disk): its warm-up, an
    opening after it, a poll, a second opening (another tab: the dashboard's trial lists
    have expired), an opening after ``pause`` seconds with nobody looking, and one with
    every body made stale (as if the keeper had fallen behind: the store is read again
    before answering)."""
    runs: dict[str, list[float]] = {k: [] for k in ("warm_up", "open", "poll", "again", "pause", "reopen")}
    data: dict[str, Any] = {}
    for _ in range(repeats):
        storage = make_storage()
        study_id = next(iter(storage.studies()))
        started = time.perf_counter()
        base, app, stop = serve(storage)
        try:
            app.kubetune_details.warmed.wait()
            runs["warm_up"].append(time.perf_counter() - started)
            seconds, data = browser.open_page(base, study_id)
            runs["open"].append(seconds)
            runs["poll"].append(browser.poll(base, study_id, data["trials"]))
            expire_trial_lists(app)
            runs["again"].append(browser.open_page(base, study_id)[0])
            time.sleep(pause)   # nobody looking: the keeper alone reads the store
            runs["pause"].append(browser.open_page(base, study_id)[0])
            expire_trial_lists(app)
            app.kubetune_details.expire()
            runs["reopen"].append(browser.open_page(base, study_id)[0])
        finally:
            stop()
    return summary(runs, data)


def measure_peer(browser: Browser, make_storage: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """optuna-dashboard's own app: an opening on a new dashboard, a poll, and an opening
    once its trial list expired."""
    runs: dict[str, list[float]] = {"open": [], "poll": [], "reopen": []}
    data: dict[str, Any] = {}
    for _ in range(repeats):
        storage = make_storage()
        base, app, stop = serve_plain(storage)
        try:
            study_id = storage.get_all_studies()[0]._study_id
            seconds, data = browser.open_page(base, study_id)
            runs["open"].append(seconds)
            runs["poll"].append(browser.poll(base, study_id, data["trials"]))
            expire_trial_lists(app)
            runs["reopen"].append(browser.open_page(base, study_id)[0])
        finally:
            stop()
    return summary(runs, data)


def summary(runs: dict[str, list[float]], data: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {f"{k}_s": round(statistics.median(v), 3) for k, v in runs.items()}
    figures.update({f"{k}_all": [round(x, 3) for x in v] for k, v in runs.items()})
    figures.update({k: data.get(k, 0) for k in ("trials", "best_trials", "intermediate_values", "bytes")})
    return figures


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
    parser.add_argument("--pause", type=float, default=75.0,
                        help="seconds nobody looks at the dashboard before the 'after a pause' opening")
    parser.add_argument("--store", default="", help="results store URL (default: a new SQLite file in a temp dir); "
                        "a store holding the benchmark's Experiment at this size is reused")
    parser.add_argument("--rdb-peer", action="store_true", help="also measure Optuna's RDBStorage (SQLite)")
    parser.add_argument("--restart-only", action="store_true",
                        help="only the first openings on a new process (and the peer): a few minutes")
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
                                   "build_s": round(time.monotonic() - started, 1), "commit": commit_label(),
                                   "load_before": round(os.getloadavg()[0], 1)}
        browser = Browser()
        study_id = next(iter(ResultsStoreStorage(open_store(url, read_only=True)).studies()))
        figures["kubetune_restart"] = measure_restarts(browser, url, study_id, args.repeats)
        if not args.restart_only:
            figures["kubetune"] = measure_kubetune(
                browser, lambda: ResultsStoreStorage(open_store(url, read_only=True)), args.repeats, args.pause)
        trials, directions = peer_trials(url, uid)
        figures["optuna_inmemory"] = measure_peer(
            browser, lambda: optuna_storage(optuna.storages.InMemoryStorage(), trials, directions), args.repeats)
        if args.rdb_peer:
            rdb_url = f"sqlite:///{tmp}/optuna.db"
            print("building Optuna's RDBStorage peer", file=sys.stderr)
            optuna_storage(optuna.storages.RDBStorage(rdb_url), trials, directions)
            figures["optuna_rdb"] = measure_peer(browser, lambda: optuna.storages.RDBStorage(rdb_url), args.repeats)
        browser.close()
        figures["load_after"] = round(os.getloadavg()[0], 1)
    report(figures, args.repeats)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(figures, indent=2))
    served = [figures[k]["trials"] for k in ("kubetune", "kubetune_restart") if k in figures]
    return 0 if all(n == args.trials for n in served) else 1


def report(figures: dict[str, Any], repeats: int) -> None:
    restart, peer = figures["kubetune_restart"], figures["optuna_inmemory"]
    ours = figures.get("kubetune")
    print(f"\ndashboard opening an Experiment of {figures['trials']} trials x {figures['results_per_trial']} results "
          f"({restart['trials']} trials, {restart['intermediate_values']} intermediate values, "
          f"{restart['best_trials']} on the Pareto front served); commit {figures['commit']}, load "
          f"{figures['load_before']} -> {figures['load_after']}; medians of {repeats}; target: open <= 2 s")
    print(f"  kubetune, first open on a process just started (listening after {restart['listen_s']:.2f} s): "
          f"{restart['first_kept_s']:.2f} s with the page its last run kept, {restart['first_nothing_kept_s']:.2f} s "
          f"with nothing kept (it waits for the store; the dashboard's CPU meanwhile "
          f"{restart['first_nothing_kept_cpu_s']:.2f} s)")
    if ours:
        print(f"  kubetune, open after the start-up warm-up: {ours['open_s']:.2f} s   again: {ours['again_s']:.2f} s   "
              f"after a pause: {ours['pause_s']:.2f} s   poll: {ours['poll_s']:.3f} s   with the body stale (store "
              f"read first): {ours['reopen_s']:.2f} s   warm-up at start (in the background): "
              f"{ours['warm_up_s']:.2f} s")
    for name in ("optuna_inmemory", "optuna_rdb"):
        if name in figures:
            theirs = figures[name]
            print(f"  peer optuna-dashboard over {name.split('_')[1]}: open {theirs['open_s']:.2f} s   re-open "
                  f"{theirs['reopen_s']:.2f} s   poll {theirs['poll_s']:.3f} s")
    ratios = (f"first open after a restart {restart['first_kept_s'] / peer['open_s']:.3f}   first open, nothing "
              f"kept {restart['first_nothing_kept_s'] / peer['open_s']:.2f}")
    if ours:
        ratios += (f"   open {ours['open_s'] / peer['open_s']:.3f}   again {ours['again_s'] / peer['reopen_s']:.3f}   "
                   f"after a pause {ours['pause_s'] / peer['reopen_s']:.3f}   "
                   f"body stale {ours['reopen_s'] / peer['reopen_s']:.3f}")
    print(f"  kubetune / peer: {ratios}")


if __name__ == "__main__":
    sys.exit(main())
