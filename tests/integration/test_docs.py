"""Docs that cannot rot (issue 32): the site builds with warnings as errors, every YAML
block of README.md and docs/ that is a Kubernetes object is accepted by the real API
server, every shell block marked runnable runs, and README.md's links resolve.
(Each Experiment in the docs is also applied for real and compared with `kubetune run`
in test_kubectl_examples.py.)"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from doc_blocks import REPO, RUNNABLE, SHELLS, all_blocks, blocks, doc_pages

pytestmark = pytest.mark.integration

BLOCKS = all_blocks()
# kinds of other projects the docs may show; the test API server does not serve them,
# so they are parsed but not applied (everything else is applied)
FOREIGN_GROUPS = {"argoproj.io", "kueue.x-k8s.io", "ray.io", "monitoring.coreos.com"}


def mkdocs(*args: str, config: Path = REPO / "mkdocs.yml") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    done = mkdocs("-d", str(tmp_path / "site"))
    assert done.returncode == 0, done.stderr[-4000:]
    for page in ("reference/experiment.html", "reference/cli.html", "reference/helm-values.html",
                 "reference/metrics.html", "reference/events.html", "changelog.html"):
        assert (tmp_path / "site" / page).is_file(), page       # the generated pages are in it
    explained = (tmp_path / "site" / "reference" / "experiment.html").read_text()
    assert "spec.scheduler.type" in explained and "keep the top 1/reductionFactor" in explained


def test_a_broken_link_fails_the_build(tmp_path):
    """The check above can fail: the same site with one link to a missing page does."""
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](no-such-page.md)\n")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python", "!python"))
    config.update(docs_dir=str(docs), hooks=[str(REPO / h) for h in config.get("hooks", [])])
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = mkdocs("-d", str(tmp_path / "site"), config=tmp_path / "mkdocs.yml")
    assert done.returncode != 0 and "no-such-page.md" in done.stderr, done.stderr[-2000:]


def kubernetes_objects() -> list[tuple[str, dict]]:
    found = []
    for block in BLOCKS:
        if block.language not in ("yaml", "yml"):
            continue
        for doc in yaml.safe_load_all(block.body):      # every YAML block parses
            if isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc:
                found.append((block.where, doc))
    return found


OBJECTS = kubernetes_objects()


def test_the_docs_show_kubernetes_objects_and_every_yaml_block_parses():
    assert len(OBJECTS) >= 8, [where for where, _ in OBJECTS]
    assert any(where.startswith("README.md") for where, _ in OBJECTS)


@pytest.mark.parametrize("where,obj", OBJECTS, ids=[where for where, _ in OBJECTS])
def test_every_kubernetes_object_in_the_docs_is_accepted_by_the_api_server(kubectl, namespace, where, obj):
    group = obj["apiVersion"].rpartition("/")[0]
    if group in FOREIGN_GROUPS:
        pytest.skip(f"{obj['kind']} ({group}) is not served by the test API server")
    wanted = (obj.get("metadata") or {}).get("namespace")
    if wanted:      # a namespace the docs name: make it, as the reader would have
        kubectl("create", "namespace", wanted, check=False)
    done = kubectl("apply", "--dry-run=server", "-n", wanted or namespace, "-f", "-",
                   input=yaml.safe_dump(obj), check=False)
    assert done.returncode == 0, f"{where}: the API server refuses the {obj['kind']}: {done.stderr}"


def runnable_pages() -> dict[tuple, list[str]]:
    """What each page runs (its titled files, then its runnable blocks), and which pages
    run exactly that: the README's path and the tutorial's are one run."""
    runs: dict[tuple, list[str]] = {}
    for path in doc_pages():
        page_blocks = blocks(path.read_text(), str(path.relative_to(REPO)))
        commands = [b.body.strip() for b in page_blocks if b.runnable]
        if not commands:
            continue
        files = tuple(sorted((b.title, b.body) for b in page_blocks if b.title))
        key = (files, "\n".join(commands))
        runs.setdefault(key, []).append(str(path.relative_to(REPO)))
    return runs


RUNS = runnable_pages()


def test_runnable_blocks_are_shell_and_the_readme_has_some():
    marked = [b for b in BLOCKS if b.runnable]
    assert [b.where for b in marked if b.language not in SHELLS] == []
    assert any(b.page == "README.md" for b in marked)
    # a marker that is not right above a block is a typo that would run nothing
    for path in doc_pages():
        lines = path.read_text().split("\n")
        for index, line in enumerate(lines):
            if line.strip() == RUNNABLE:
                assert index + 1 < len(lines) and lines[index + 1].startswith("```"), \
                    f"{path.relative_to(REPO)}:{index + 1}: {RUNNABLE} must be right above a ``` block"


@pytest.mark.parametrize("run", list(RUNS), ids=[" + ".join(pages) for pages in RUNS.values()])
def test_every_runnable_shell_block_runs(run, tmp_path):
    files, script = run
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "crds", "charts"):      # the reader works in a clone
        (work / name).symlink_to(REPO / name)
    for name, body in files:
        (work / name).write_text(body)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "KUBETUNE_RESULTS_URL": f"sqlite:///{tmp_path}/results.db"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' + '.join(RUNS[run])}: exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (MkDocs) and GitHub give a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[\s]+", "-", text)


def test_every_link_in_the_readme_resolves():
    readme = (REPO / "README.md").read_text()
    links = LINK.findall(readme)
    assert len(links) >= 10
    broken = []
    for target in links:
        if re.match(r"https?://", target):
            continue                    # no network here: outside links are not fetched
        path, _, anchor = target.partition("#")
        file = (REPO / path).resolve()
        if not file.exists():
            broken.append(target)
        elif anchor and anchor not in {slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)}:
            broken.append(target)
    assert broken == [], f"README.md links that resolve to nothing: {broken}"


def test_the_block_reader_finds_titles_markers_and_indented_blocks():
    text = ('x\n\n```python title="a.py"\nprint(1)\n```\n\n<!-- runnable -->\n```sh\necho hi\n```\n\n'
            '1. step\n\n    ```sh\n    ls\n    ```\n')
    found = blocks(text)
    assert [(b.language, b.title, b.runnable, b.body) for b in found] == [
        ("python", "a.py", False, "print(1)\n"), ("sh", "", True, "echo hi\n"), ("sh", "", False, "ls\n")]
