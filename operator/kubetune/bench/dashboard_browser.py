"""Opening the 10,000-trial Experiment's page in a real browser: headless Chromium (Debian's,
driven by Playwright, as tests/integration/test_dashboard_browser.py does), timed from
``goto`` until the study page shows its Pareto front with its points drawn (every trial
fetched, parsed and plotted): what a user waits for, beyond the HTTP fetches that
``kubetune.bench.dashboard`` times.

kubetune: ``kubetune dashboard`` started as a new process with nothing kept (a new Pod),
the page opened the moment it listens; then a restart with the page it kept.  The peer:
optuna-dashboard's own app over Optuna's InMemoryStorage holding the same frozen trials,
a new app per repeat.  Uses the store ``kubetune.bench.dashboard`` builds (``--store``)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kubetune.bench.dashboard import (BENCH_UID, Process, built, optuna_storage, peer_trials, serve_plain,
                                      wait_kept)
from kubetune.bench.machine import commit_label

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
TIMEOUT_MS = 600_000


def opened(browser, url: str, screenshot: Path | None = None) -> float:
    """Seconds from ``goto`` to the Pareto front's title and its first point on the page."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    try:
        started = time.perf_counter()
        page.goto(url)
        page.get_by_text("Pareto Front").first.wait_for()
        page.locator(".scatterlayer .point").first.wait_for()
        seconds = time.perf_counter() - started
        if screenshot is not None:
            page.screenshot(path=str(screenshot))
        return seconds
    finally:
        page.close()


def measure_kubetune(browser, url: str, study_id: int, repeats: int, shots: Path) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {"nothing_kept": [], "kept": []}
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kt-bench-dashboard-browser-") as cache:
            process = Process(url, cache)
            try:
                runs["nothing_kept"].append(opened(browser, f"{process.base}/dashboard/studies/{study_id}",
                                                   shots / f"kubetune-{repeat}.png"))
                wait_kept(cache)
            finally:
                process.stop()
            process = Process(url, cache)
            try:
                runs["kept"].append(opened(browser, f"{process.base}/dashboard/studies/{study_id}"))
            finally:
                process.stop()
    return runs


def measure_peer(browser, url: str, repeats: int, shots: Path) -> list[float]:
    import optuna
    trials, directions = peer_trials(url, BENCH_UID)
    runs = []
    for repeat in range(repeats):
        storage = optuna_storage(optuna.storages.InMemoryStorage(), trials, directions)
        base, _app, stop = serve_plain(storage)
        try:
            study_id = storage.get_all_studies()[0]._study_id
            runs.append(opened(browser, f"{base}/dashboard/studies/{study_id}", shots / f"peer-{repeat}.png"))
        finally:
            stop()
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubetune.bench.dashboard_browser",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store `python -m kubetune.bench.dashboard --store` built")
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--results", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--screenshots", default=tempfile.gettempdir(), help="directory for the pages' screenshots")
    parser.add_argument("--out", default="", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if not built(args.store, args.trials, args.results):
        parser.error(f"{args.store} does not hold the benchmark's Experiment: run python -m kubetune.bench.dashboard "
                     f"--store {args.store} first")
    if not os.path.exists(CHROMIUM):
        parser.error(f"{CHROMIUM} is missing: `make chromium` installs it (Debian's chromium package)")
    import optuna
    from playwright.sync_api import sync_playwright
    from kubetune.dashboard.storage import ResultsStoreStorage
    from kubetune.results import open_store
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shots = Path(args.screenshots)
    shots.mkdir(parents=True, exist_ok=True)
    study_id = next(iter(ResultsStoreStorage(open_store(args.store, read_only=True)).studies()))
    figures = {"commit": commit_label(), "load_before": round(os.getloadavg()[0], 1)}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ours = measure_kubetune(browser, args.store, study_id, args.repeats, shots)
            peer = measure_peer(browser, args.store, args.repeats, shots)
        finally:
            browser.close()
    figures["load_after"] = round(os.getloadavg()[0], 1)
    for name, runs in (("kubetune_nothing_kept", ours["nothing_kept"]), ("kubetune_kept", ours["kept"]),
                       ("peer", peer)):
        figures[f"{name}_s"], figures[f"{name}_all"] = round(statistics.median(runs), 2), [round(x, 2) for x in runs]
    print(f"\nChromium opening the study page ({args.trials} trials x {args.results} results) until its Pareto "
          f"front is drawn; commit {figures['commit']}, load {figures['load_before']} -> {figures['load_after']}, "
          f"medians of {args.repeats}; screenshots in {shots}")
    print(f"  kubetune, new process, nothing kept: {figures['kubetune_nothing_kept_s']:.2f} s "
          f"{figures['kubetune_nothing_kept_all']}; with the page kept: {figures['kubetune_kept_s']:.2f} s "
          f"{figures['kubetune_kept_all']}")
    print(f"  peer optuna-dashboard over InMemoryStorage: {figures['peer_s']:.2f} s {figures['peer_all']}")
    print(f"  kubetune / peer: nothing kept {figures['kubetune_nothing_kept_s'] / figures['peer_s']:.3f}   kept "
          f"{figures['kubetune_kept_s'] / figures['peer_s']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
