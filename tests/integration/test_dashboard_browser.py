"""``kubetune dashboard`` in a real headless browser (Debian's Chromium, driven by
Playwright; ``make chromium`` installs the browser): a finished multi-objective
Experiment run by ``kubetune run``, and a running one whose results the operator's
own writer (ResultsRecorder -> ResultsWriter) keeps adding while the page is open.

What is checked on the pages is computed independently here, from the run's own
summary and the store's rows: the study, its trial count, one trial's intermediate
values, the Pareto front (non-dominated succeeded trials, plain loops), and a new
trial appearing on an open page without a reload.  Screenshots go to the test's
tmp dir (the path is printed)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kube_fixtures import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((REPO / "examples" / "multi-objective.yaml").read_text())
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
PAGE_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        if os.geteuid() != 0:
            pytest.skip(f"{CHROMIUM} is missing and this user cannot install it: "
                        "run `make chromium` as root (apt-get install chromium)")
        pytest.fail(f"{CHROMIUM} is missing: `make chromium` installs it (Debian's chromium package)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Dashboard:
    """``kubetune dashboard ...`` as a child process, on a free port."""

    def __init__(self, *args: str, store: str, log: Path) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kubetune", "dashboard", *args, "--store", store, "--port", "0",
             "--cache-dir", str(log.parent / "dashboard-cache")],
            stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
        line = self.process.stdout.readline()   # the command prints its address once it listens
        match = re.search(r"(http://\S+?)(/dashboard\S*)", line)
        assert match, f"no address printed: {line!r}; stderr: {log.read_text()[-2000:]}"
        self.base, self.page = match.group(1), match.group(2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(PAGE_TIMEOUT_MS)
    page.goto(url)
    return page


def shoot(page, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def dominates(a, b) -> bool:
    return all(x <= y for x, y in zip(a, b)) and a != b


# ---------------------------------------------------------------------- a finished Experiment


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """examples/multi-objective.yaml run by ``kubetune run`` into a store of its own."""
    tmp = tmp_path_factory.mktemp("finished")
    url = f"sqlite:///{tmp / 'results.db'}"
    env = {**os.environ, "KUBECONFIG": str(tmp / "none"), "RAY_USAGE_STATS_ENABLED": "0", "KUBETUNE_RESULTS_URL": url}
    completed = subprocess.run([sys.executable, "-m", "kubetune", "run", str(REPO / "examples" / "multi-objective.yaml"),
                                "--output", "json"], capture_output=True, text=True, timeout=600, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return url, json.loads(completed.stdout), tmp


def test_a_finished_multi_objective_experiment_shows_its_trials_curves_and_pareto_front(browser, finished):
    url, summary, tmp = finished
    trials = summary["trials"]
    dashboard = Dashboard("multi-objective", "-n", "local", store=url, log=tmp / "dashboard.log")
    try:
        study = f"{dashboard.base}{dashboard.page}"
        # the study list names the Experiment with both directions
        page = open_page(browser, f"{dashboard.base}/dashboard")
        page.get_by_text("local/multi-objective").wait_for()
        page.get_by_text("Direction: MINIMIZE, MINIMIZE").wait_for()

        # the study's page: the Pareto front plot and its trials
        page.goto(study)
        page.get_by_text("Pareto Front").first.wait_for()
        page.locator(".scatterlayer .point").first.wait_for()
        succeeded = {int(t["name"].rsplit("-", 1)[1]): (t["lastMetrics"]["loss"], t["lastMetrics"]["model_size"])
                     for t in trials if t["phase"] == "Succeeded"}
        front = {n for n, p in succeeded.items() if not any(dominates(q, p) for q in succeeded.values())}
        assert front, summary
        best = page.locator("h6:has-text('Best Trials') >> xpath=..")
        for number in front:   # every trial of the front, by its number (the Trial's index)
            best.get_by_text(f"Trial {number}", exact=True).wait_for()
        shown = {int(n) for n in re.findall(r"^Trial (\d+)$", best.inner_text(), re.M)}
        assert shown == front, (shown, front)
        shoot(page, tmp / "study.png")

        # the trial list: every trial; one trial's intermediate values are its reports
        page.goto(f"{study}/trials")
        page.get_by_text(f"{len(trials)} Trials", exact=True).wait_for()
        number = min(front)
        name = next(t["name"] for t in trials if t["name"].endswith(f"-{number}"))
        page.get_by_text(f"Trial {number}", exact=True).first.click()
        values = page.locator("text=Intermediate Values >> xpath=..")
        from kubetune.results import open_store
        store = open_store(url, create=False)
        try:
            experiment = store.experiment("local", "multi-objective")
            uid = next(t.uid for t in store.trials(experiment.uid) if t.name == name)
            reported = [(r.iteration, r.metrics["loss"]) for r in store.results(experiment.uid, uid)]
        finally:
            store.close()
        assert len(reported) == EXAMPLE["spec"]["trial"]["config"]["iterations"]
        for iteration, loss in reported:
            values.get_by_text(f"{iteration} {loss!r}", exact=True).wait_for()
        shoot(page, tmp / "trial.png")
    finally:
        dashboard.stop()


# ---------------------------------------------------------------------- a running Experiment


def test_a_running_experiment_shows_a_new_trial_without_a_reload(browser, tmp_path):
    from kubetune.controller.results_recorder import ResultsRecorder
    from kubetune.results import Batch, ResultRow, open_store
    from kubetune.results.writer import ResultsWriter
    from kubetune.spec.results import Result

    url = f"sqlite:///{tmp_path / 'results.db'}"
    body = {"metadata": {"name": "growing", "uid": "growing-uid"}, "spec": EXAMPLE["spec"]}
    writer = ResultsWriter(lambda: open_store(url))
    recorder = ResultsRecorder(writer, "team-a", lambda: body)
    recorder.experiment_status({"phase": "Running"})

    def add_trial(index: int, phase: str) -> None:
        name = f"growing-{index}"
        recorder.trial({"metadata": {"name": name, "uid": f"growing-uid-{index}"},
                        "spec": {"index": index, "parameters": {"lr": 0.01, "width": 128, "depth": 1 + index % 4}},
                        "status": {"phase": phase}})
        writer.submit(Batch(results=[ResultRow.of(recorder.uid(name), Result(
            seq=i, iteration=i + 1, timestamp=time.time(),
            metrics={"loss": 1.0 / (i + 1) + index, "model_size": 0.1 * (index + 1), "memory_gb": 1.0}))
            for i in range(3)]))
        assert writer.flush(30), writer.problem

    for index in range(3):
        add_trial(index, "Succeeded" if index < 2 else "Running")
    dashboard = Dashboard("growing", store=url, log=tmp_path / "dashboard.log")
    try:
        page = open_page(browser, f"{dashboard.base}{dashboard.page}/trials")
        page.get_by_text("3 Trials", exact=True).wait_for()
        page.evaluate("window.__kubetuneNotReloaded = true")   # a reload would drop it
        shoot(page, tmp_path / "running-before.png")
        add_trial(3, "Running")   # while the page is open: the dashboard's live update polls
        recorder.trial_state("growing-2", phase="Succeeded", reason="", best=None, iteration=3, attempt=0)
        assert writer.flush(30), writer.problem
        page.get_by_text("4 Trials", exact=True).wait_for(timeout=90_000)
        page.get_by_text("Trial 3", exact=True).first.wait_for()
        shoot(page, tmp_path / "running-after.png")
        assert page.evaluate("window.__kubetuneNotReloaded === true"), "the page was reloaded"
    finally:
        dashboard.stop()
        writer.close()
