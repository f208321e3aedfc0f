"""The fenced code blocks of the project's documents, for the tests that
run them (test_docs.py) and the type check of them (typecheck_docs.py).

A block runs as `python {file}` unless the comment line just above its fence
says how: `<!-- run: mpiexec -n 3 python {file} {tmp}/store -->`, several
commands separated by ` ;; ` and run in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
DOCUMENTS = [PROJECT / "README.md", PROJECT / "docs" / "guide.md", PROJECT / "docs" / "design.md"]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_RUN = re.compile(r"<!-- run: (.*?) -->\s*$")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int
    language: str
    code: str
    commands: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.document.name}:{self.line}"


def blocks(language: str) -> list[Block]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for match in _FENCE.finditer(text):
            if match.group(1) != language:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marker = _RUN.search(before)
            commands = tuple(marker.group(1).split(" ;; ")) if marker else ("python {file}",)
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(document, line, language, match.group(2), commands))
    return found
