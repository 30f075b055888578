"""The docs site says what the product does now (issue 42, item 5): no page speaks of its
own past, of the engineers who wrote it, or of a machine's hours. History goes to the
CHANGELOG and measurement diaries to ``benchmarks/RESULTS.md``.

Red on 03c27cd: "used to live in the memory" (durable-runs.md), "used to poll"
(recovery.md), "the 2-core box shared with other engineers' test runs"
(celery-features.md), "the spec's example" (a spec users never see).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Words of a diary, not of reference: a work period, its authors, its machine, its past.
DIARY = re.compile(
    r"\bused to\b|\bsessions? \d|\bother engineers\b|\bthis VM\b|\bthe spec's example\b|\bfast hours?\b"
    r"|\bback to back with the previous commit\b|\bback to back before\b",
    re.IGNORECASE,
)

#: Pages that are history by design.
HISTORY = {"changelog.md"}


def pages() -> list[Path]:
    """The docs site's pages and the README."""
    return [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name not in HISTORY] + [ROOT / "README.md"]


def test_no_docs_page_speaks_of_its_own_past():
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)!r}" for p in pages()
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in DIARY.finditer(line)]
    assert not found, "diary words in the docs (say what the product does now):\n" + "\n".join(found)


def test_the_upgrading_page_names_the_current_schema_revision():
    """docs/upgrading.md's examples say what this release's ``aaa migrate`` prints: the head
    revision (issue 42 found them two revisions behind; they were again after 0005)."""
    from aaa_celery.stores.sql.versions import REVISIONS

    text = (ROOT / "docs" / "upgrading.md").read_text()
    named = re.findall(r"release\s+needs (\d{4})|-> (\d{4})|starts at (\d{4})", text)
    revisions = {r for group in named for r in group if r}
    assert revisions == {REVISIONS[-1]}, f"docs/upgrading.md names {sorted(revisions)}, the head is {REVISIONS[-1]}"
