"""Small Markdown helpers shared by the generators."""
from __future__ import annotations

from typing import Iterable


def cell(text: object) -> str:
    """One table cell: no line breaks, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


GENERATED = ("!!! note \"Generated\"\n    This page is generated from `{source}` when the site is built "
             "(`make docs`); change the source, not the page.\n\n")
