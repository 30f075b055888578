"""The code blocks of the README and the docs site, as a user reads them.

A block of shell (``bash``, ``sh``, ``console``) or Python is a command a user may be told
to run. Each is either run by ``test_doc_blocks.py`` as written, or marked in the page
itself, on the line before its fence, as one that is not run as written::

    <!-- illustrative: a fragment of your own project (it names your app and your PSP) -->


A fence marked ``<!-- output -->`` holds what the block before it prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COMMAND_LANGUAGES = frozenset({"bash", "sh", "shell", "console", "python", "pycon"})
FENCE = re.compile(r"^(\s*)(```+)(\S*)")
MARK = re.compile(r"^\s*<!--\s*(illustrative|output)\s*(?::\s*(.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mark: str | None  # "illustrative", "output" or None
    reason: str

    @property
    def is_command(self) -> bool:
        return self.language in COMMAND_LANGUAGES and self.mark != "output"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, ticks, language = opened.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(ticks):
            end += 1
        back = i - 1
        while back >= 0 and not lines[back].strip() and back >= i - 2:  # one blank line may stand between
            back -= 1
        previous = lines[back] if back >= 0 else ""
        mark = MARK.match(previous)
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
        found.append(Block(str(path.relative_to(ROOT)), i + 1, language, body + "\n",
                           mark.group(1) if mark else None, (mark.group(2) or "") if mark else ""))
        i = end + 1
    return found


def command_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p) if b.is_command]


def output_after(block: Block) -> Block | None:
    """The ``<!-- output -->`` block that follows ``block`` on its page, if any."""
    page = blocks(ROOT / block.page)
    for this, following in zip(page, page[1:]):
        if this == block and following.mark == "output":
            return following
    return None
