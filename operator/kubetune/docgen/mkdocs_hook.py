"""MkDocs hook (mkdocs.yml: ``hooks``): adds the generated reference pages to the site
at build time, from this checkout's sources (crds/, charts/, the CLI, metrics)."""
from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[3]


def _this_checkouts_kubetune() -> None:
    """Import kubetune from this checkout, even where another copy is installed or was
    imported already: the reference must describe the code next to these docs. (MkDocs
    restores sys.path after loading a hook, so this runs at build time.)"""
    source = str(REPO / "operator")
    if sys.path[:1] != [source]:
        sys.path.insert(0, source)
    loaded = getattr(sys.modules.get("kubetune"), "__file__", None)
    if loaded and not loaded.startswith(source):
        for name in [name for name in sys.modules if name == "kubetune" or name.startswith("kubetune.")]:
            del sys.modules[name]


def pages() -> dict[str, str]:
    """Site path -> Markdown, each from the source it documents."""
    _this_checkouts_kubetune()
    from kubetune.docgen import cli_reference, crd_reference, events_reference, helm_reference
    return {
        "reference/experiment.md": crd_reference.render(REPO / "crds" / "experiment.yaml"),
        "reference/trial.md": crd_reference.render(REPO / "crds" / "trial.yaml"),
        "reference/cli.md": cli_reference.render(),
        "reference/helm-values.md": helm_reference.render(REPO / "charts" / "kubetune" / "values.yaml"),
        "reference/metrics.md": events_reference.render_metrics(),
        "reference/events.md": events_reference.render_events(),
        # the changelog lives at the root (Keep a Changelog); the site shows it as is
        "changelog.md": (REPO / "CHANGELOG.md").read_text(),
    }


def on_files(files, config):
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files
