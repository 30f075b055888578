"""A figure in the README, the docs, the CHANGELOG or the benchmark diary is labelled by a date,
a commit or a release: never by a numbered work period ("session 12"), which a reader cannot
look up (issue 41). ``docs/performance.md`` gives each row its date and commit; the history is in
``benchmarks/RESULTS.md``, each entry headed by its day and commit."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: "session 12", "Sessions 8", "session 4's": a work period's number, not a date or a commit.
WORK_PERIOD = re.compile(r"\bsessions?\s+\d+", re.IGNORECASE)

#: A diary entry's heading: "## 2026-12-04 01:46–01:57, 18cb757: ...".
DATED_HEADING = re.compile(r"^## \d{4}-\d{2}-\d{2}\b.*\b[0-9a-f]{7,40}\b")


def documents(root: Path) -> list[Path]:
    """Where figures are given: the README, the CHANGELOG, the docs and the benchmark diary."""
    return [root / "README.md", root / "CHANGELOG.md", root / "benchmarks" / "RESULTS.md",
            *sorted((root / "docs").rglob("*.md"))]


def work_period_labels(root: Path) -> list[str]:
    """``path:line: text`` of each numbered work-period label in ``documents(root)``."""
    found = []
    for path in documents(root):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if WORK_PERIOD.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()[:160]}")
    return found


def test_no_figure_is_labelled_by_a_work_period() -> None:
    found = work_period_labels(ROOT)
    assert not found, ("label these by the date and the commit of the run (git log -S finds the commit"
                       " that added the figure), not by a work period:\n" + "\n".join(found))


def test_the_performance_page_labels_each_row_by_date_and_commit() -> None:
    """Every row of the throughput tables starts with its date and the commit it measured."""
    page = (ROOT / "docs" / "performance.md").read_text()
    section = page.split("## Guarded ÷ plain throughput", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| date") and not set(line) <= set("|- ")]
    assert rows, "docs/performance.md has no throughput rows"
    undated = [r for r in rows if not re.match(r"\| \d{4}-\d{2}-\d{2}( \d{2}:\d{2})? \| [0-9a-f]{7,40} \|", r)]
    assert not undated, "rows without a date and a commit:\n" + "\n".join(undated)


def test_each_diary_entry_is_headed_by_its_day_and_commit() -> None:
    headings = [line for line in (ROOT / "benchmarks" / "RESULTS.md").read_text().splitlines()
                if line.startswith("## ")]
    assert headings, "benchmarks/RESULTS.md has no entries"
    undated = [h for h in headings if not DATED_HEADING.match(h)]
    assert not undated, "entries without their day and commit first:\n" + "\n".join(undated)


#: A measured figure in prose: a time or a rate ("562 s", "0.7–1.8 ms", "1,027 calls/s").
MEASURED = re.compile(r"\d[\d,.]*\s*(?:ms|µs|s|calls/s)\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def unlabelled_paragraphs(text: str, section: str) -> list[str]:
    """The paragraphs of ``section`` (a ``## `` heading's text) that give a measured figure
    without a date and a commit; a table is labelled by the paragraph before it."""
    body = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    body = re.sub(r"```.*?```", "", body, flags=re.DOTALL)
    found = []
    for paragraph in re.split(r"\n\s*\n", body):
        if paragraph.lstrip().startswith(("|", "<!--")):
            continue
        if MEASURED.search(paragraph) and not (DATE.search(paragraph) and COMMIT.search(paragraph)):
            found.append(" ".join(paragraph.split())[:200])
    return found


def test_the_readmes_measured_figures_carry_a_date_and_a_commit() -> None:
    found = unlabelled_paragraphs((ROOT / "README.md").read_text(), "Measured: the guard beside plain Celery")
    assert not found, "give these figures the date and the commit of their run:\n" + "\n".join(found)
