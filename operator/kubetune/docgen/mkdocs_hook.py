"""MkDocs hook (mkdocs.yml: ``hooks``): adds the generated reference pages to the site
at build time, from this checkout's sources (crds/, charts/, the CLI, metrics)."""
from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[3]
# the sources of this checkout, even where another copy of kubetune is installed
sys.path.insert(0, str(REPO / "operator"))


def pages() -> dict[str, str]:
    """reference/<page>.md -> Markdown, each from the source it documents."""
    from kubetune.docgen import cli_reference, crd_reference, events_reference, helm_reference
    return {
        "reference/experiment.md": crd_reference.render(REPO / "crds" / "experiment.yaml"),
        "reference/trial.md": crd_reference.render(REPO / "crds" / "trial.yaml"),
        "reference/cli.md": cli_reference.render(),
        "reference/helm-values.md": helm_reference.render(REPO / "charts" / "kubetune" / "values.yaml"),
        "reference/metrics.md": events_reference.render_metrics(),
        "reference/events.md": events_reference.render_events(),
    }


def on_files(files, config):
    for path, content in pages().items():
        files.append(File.generated(config, path, content=content))
    return files
