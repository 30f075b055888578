"""The README and the docs site (issue 19): the README stays short and its links resolve; the
site under docs/ builds with ``mkdocs build --strict``, so a broken link, a missing anchor, a
page left out of the nav or an API reference to a name that is gone fails CI."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: The modules the API reference documents (docs/reference/<module>.md), each with all of its __all__.
REFERENCE = [
    "aaa_celery", "aaa_celery.errors", "aaa_celery.tools", "aaa_celery.runtime", "aaa_celery.testing",
    "aaa_celery.testing.pytest_plugin", "aaa_celery.testing.effects", "aaa_celery.policy",
    "aaa_celery.fencing", "aaa_celery.effects", "aaa_celery.contrib.django.effects", "aaa_celery.llm", "aaa_celery.algos", "aaa_celery.contrib.flask",
    "aaa_celery.contrib.django", "aaa_celery.contrib.mcp", "aaa_celery.contrib.pydantic_ai",
]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_outside_the_site() -> list[Path]:
    """The repository's Markdown files that mkdocs does not check: all but docs/."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in listed
            if not p.startswith("docs/") and "site-packages/" not in p and (ROOT / p).exists()]  # not a venv's


def broken_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # links in code blocks are code
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (not ours to fetch) or an anchor in the same file
        if not (path.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    return broken


def test_the_readme_is_at_most_400_lines():
    # issue 19: it was 1,090 lines, a lab notebook; the rest lives on the docs site
    assert len((ROOT / "README.md").read_text().splitlines()) <= 400


def test_the_readme_quickstart_shows_the_two_commands_and_what_the_first_prints():
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1]
    commands, printed = re.findall(r"```(?:bash|text)?\n(.*?)```", quickstart, re.S)[:2]
    assert [line.split("#")[0].strip() for line in commands.strip().splitlines()] == [
        "pip install -e . && python examples/refund.py", "scripts/test"]
    done = subprocess.run([sys.executable, "examples/refund.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == printed.strip().splitlines()


def test_every_relative_link_outside_the_docs_site_resolves():
    files = markdown_outside_the_site()
    assert ROOT / "README.md" in files
    broken = {str(p.relative_to(ROOT)): links for p in files if (links := broken_links(p))}
    assert broken == {}, "links to files that are not there: fix or drop them"


#: A path of this repository named in code spans (`aaa_celery/worker/recovery.py`, `tests/x.py::test_y`).
REPO_PATH = re.compile(r"`((?:aaa_celery|benchmarks|docs|examples|scripts|tests)/[^`\s*<>{}…]*)`")


def repo_path_exists(name: str) -> bool:
    name = re.sub(r":\d+(-\d+)?$", "", name)  # file.py:12-20
    # a Python object named by its file, `benchmarks/_common.DurablePostgres`
    return (ROOT / name).exists() or (ROOT / (re.sub(r"\.\w+$", "", name) + ".py")).exists()


def missing_repo_paths(path: Path) -> list[str]:
    names = {m.split("::")[0].rstrip(".,;:") for m in REPO_PATH.findall(path.read_text())}
    return sorted(n for n in names if not repo_path_exists(n))


def test_every_repository_path_the_markdown_names_exists():
    # a file moved by a refactor leaves its old path in the docs (docs/stores.md named
    # aaa_celery/stores/lua/ after the Redis store moved to aaa_celery/stores/redis/)
    files = [*markdown_outside_the_site(), *sorted((ROOT / "docs").rglob("*.md"))]
    stale = {str(p.relative_to(ROOT)): names for p in files if (names := missing_repo_paths(p))}
    assert stale == {}, "paths that are not in the repository: update them to where the file is now"


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [url](https://example.com) ![pic](gone.png) [x](docs/gone.md#a)\n"
                    "```\n[in code](not-checked.md)\n```\n")
    assert broken_links(page) == ["gone.png", "docs/gone.md#a"]
    page.write_text("`tests/project/test_docs_site.py::test_x`, `aaa_celery/gone.py`, `docs/*.md`, `aaa_celery/`,"
                    " `benchmarks/_common.DurablePostgres`, `benchmarks/gone.Thing`\n")
    assert missing_repo_paths(page) == ["aaa_celery/gone.py", "benchmarks/gone.Thing"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_the_docs_site_builds_strict(site):
    for page in ["index.html", "getting-started/index.html", "guarantees/index.html", "changelog/index.html"]:
        assert (site / page).is_file(), page
    assert "0.1.0 (commit c79799f)" in (site / "changelog" / "index.html").read_text()


@pytest.mark.parametrize("module", REFERENCE)
def test_the_api_reference_documents_every_public_name(site, module):
    html = (site / "reference" / module / "index.html").read_text()
    anchors = set(re.findall(r'id="(aaa_celery[\w.]*)"', html))
    mod = importlib.import_module(module)
    public = getattr(mod, "__all__", None) or [
        name for name, value in vars(mod).items() if not name.startswith("_") and getattr(value, "__module__", "") == module
    ]
    missing = [name for name in public
               if not any(a == f"{module}.{name}" or a.endswith(f".{name}") for a in anchors)]
    assert missing == [], f"docs/reference/{module}.md renders no entry for these"
