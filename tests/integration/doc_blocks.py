"""The fenced code blocks of the docs (README.md and docs/**/*.md), as the docs tests
read them (tests/integration/test_docs.py; how to mark a block: CONTRIBUTING.md).

- A block whose info string has ``title="NAME"`` (```` ```python title="my_train.py" ````)
  is a file the reader saves as NAME: before a page's runnable blocks run, it is written.
- A shell block right after a line ``<!-- runnable -->`` is run, in order, in a fresh
  directory holding the page's titled files and links to the repository's examples/,
  crds/ and charts/.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNNABLE = "<!-- runnable -->"
SHELLS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str           # relative to the repository
    line: int
    language: str
    title: str          # title="..." of the info string, or ""
    runnable: bool      # right after <!-- runnable -->
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(text: str, page: str = "<text>") -> list[Block]:
    found = []
    for match in FENCE.finditer(text):
        info = match["info"].strip()
        language = info.split()[0] if info else ""
        title = re.search(r'title="([^"]+)"', info)
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        indent = match["indent"]
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line
                         for line in match["body"].split("\n"))
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, language,
                           title[1] if title else "", before == RUNNABLE, body))
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_pages() for block in blocks(path.read_text(), str(path.relative_to(REPO)))]
