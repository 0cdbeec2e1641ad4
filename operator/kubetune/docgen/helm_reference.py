"""The Helm values reference, from charts/kubetune/values.yaml: each value, its default,
and the comment written above it (the chart's one place for documenting a value)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import yaml

from kubetune.docgen.markdown import GENERATED, table


def comment_above(lines: list[str], line: int) -> str:
    """The block of ``#`` lines right above ``line`` (0-based), joined."""
    block: list[str] = []
    index = line - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        block.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return " ".join(block)


def values(node: yaml.MappingNode, lines: list[str], path: str = "") -> Iterator[tuple[str, str, str]]:
    """(path, default, comment) for each key; a mapping's row has no default."""
    for key, value in node.value:
        where = f"{path}.{key.value}" if path else key.value
        comment = comment_above(lines, key.start_mark.line)
        if isinstance(value, yaml.MappingNode) and value.value:
            if comment:
                yield where, "", comment
            yield from values(value, lines, where)
        else:
            yield where, json.dumps(yaml.safe_load(yaml.serialize(value))), comment


def render(values_path: Path) -> str:
    text = values_path.read_text()
    lines = text.splitlines()
    rows = [(f"`{path}`", f"`{default}`" if default else "", comment)
            for path, default, comment in values(yaml.compose(text), lines)]
    header = comment_above(lines, 1) if lines and lines[0].startswith("#") else ""
    return ("# Helm values: `charts/kubetune`\n\n" + GENERATED.format(source="charts/kubetune/values.yaml")
            + (f"{header}\n\n" if header else "")
            + "Set them with `helm install kubetune charts/kubetune --set <value>=...` or `-f my-values.yaml`; "
              "the chart's `values.schema.json` refuses a value of the wrong type. A value without a "
              "comment of its own is explained by its section's.\n\n"
            + table(["value", "default", "what it does"], rows))
