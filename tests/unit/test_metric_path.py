"""A metric's path from ``kubetune.report`` to the Trial's status and to the results store
(issue 31: at most 12 files, both destinations together), as docs/explanation/design.md
draws it.

A hop is a file whose code carries the metric forward: it takes the metric from the
hop before (a call, a pull, a pipe, an HTTP body, an actor's answer) and hands it on.
A helper that a hop calls and that hands the metric back to that same hop (checked.py
checking an answer, render.py rendering a status, merge_patch.py diffing it, rows.py
making its store row) is listed as a helper, not counted.  Each hop names the code where the metric enters it, so a
move or rename fails here, and the drawing in the docs must list the same files:
adding a hop means updating both, in sight of the bound.
"""
from __future__ import annotations

import pathlib
import re

import pytest

import kubetune

PACKAGE = pathlib.Path(kubetune.__file__).parent
DESIGN = pathlib.Path(__file__).resolve().parents[2] / "docs" / "explanation" / "design.md"
MAX_FILES = 12

# (file under kubetune/, the code where the metric enters it)
REPORT = [("trainable/api.py", '_require("report").report(metrics, checkpoint)')]
ARRIVAL = {
    "ray": [("trainable/function_runner.py", "def report("),             # seq, buffer
            ("trainable/host.py", "batch = runner.fetch(after_seq, limit, wait_s)"),
            ("executors/ray/answers.py", "answer(answer_to, TrialHost.fetch(self"),   # JSON via Ray's KV
            ("executors/ray/executor.py", "checked.batch(read(done), key, limit)")],  # fetch rounds
    "pod": [("trainable/pod_session.py", "self._send(body)"),                # HTTP POST
            ("executors/pods/ingest_http.py", "await self._handler(method, path, headers, read_body)"),
            ("executors/pods/ingest.py", "self.inbox.offer(namespace, trial, body"),
            ("executors/pods/executor.py", "self.inbox.take(key, after_seq, limit)")],
    "local": [("trainable/pod_session.py", "self._print(body)"),             # a KUBETUNE_RESULT line
              ("executors/local/executor.py", "lines.feed(line, overlong)")],
}
OPERATOR = [("executors/platform.py", "self.executor.poll, cursors"),
            ("controller/result_pump.py", "await ctx.platform.poll(cursors")]   # to the runner and the writer
TO_STATUS = [("core/runner_events.py", "def on_trial_result("),            # history, best, scheduler
             ("controller/status_writer.py", "render.trial_status("),         # coalesced
             ("k8s/store.py", "async def patch_trial_status(")]
TO_STORE = [("results/writer.py", "store.write(part)"),                      # its thread
            ("results/store.py", "def write(self, batch")]
# called by a hop and handing the metric back to it: not hops
HELPERS = [("executors/ray/checked.py", "def batch("), ("executors/pods/stdout_results.py", "def feed("),
           ("controller/render.py", "def trial_status("), ("controller/merge_patch.py", "def merge_patch("),
           ("results/rows.py", "def of(cls, trial_uid")]


def path(platform: str, destination: list[tuple[str, str]]) -> list[str]:
    return [file for file, _ in REPORT + ARRIVAL[platform] + OPERATOR + destination]


def test_every_hop_and_helper_is_where_the_path_says():
    hops = REPORT + OPERATOR + TO_STATUS + TO_STORE + HELPERS + [h for hops in ARRIVAL.values() for h in hops]
    missing = [f"{file}: {code}" for file, code in hops
               if not (PACKAGE / file).is_file() or code not in (PACKAGE / file).read_text()]
    assert missing == [], "the metric's path moved: update this file and docs/explanation/design.md"


@pytest.mark.parametrize("platform", sorted(ARRIVAL))
def test_a_metric_reaches_status_and_store_through_at_most_12_files(platform):
    files = path(platform, TO_STATUS + TO_STORE)      # both destinations together
    assert len(files) == len(set(files))
    assert len(files) <= MAX_FILES, files


def drawing() -> str:
    text = DESIGN.read_text()
    block = text[text.index("## A metric's path"):]
    block = block[block.index("```") + 3:]
    return block[:block.index("```")]


def drawn(platform: str) -> list[str]:
    """The hops the design doc draws for ``platform`` (the paths with a folder; helpers
    are drawn by their bare names): its ``<platform> trial:`` lines, then the shared ones."""
    block = drawing()
    own = re.search(rf"^{platform} trial:(.*?)(?=^\S|\Z)", block, re.M | re.S).group(1)
    return re.findall(r"[\w]+/[\w/]+\.py", own + block[block.index("then:"):])


@pytest.mark.parametrize("platform", sorted(ARRIVAL))
def test_the_design_doc_draws_the_same_files(platform):
    assert drawn(platform) == path(platform, TO_STATUS) + [file for file, _ in TO_STORE]
    assert all(pathlib.Path(file).name in drawing() for file, _ in HELPERS)
