"""The distribution's metadata: licence, version, classifiers and project URLs (issue 19)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import aaa_celery

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_licence_file_ships_and_matches_the_metadata():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License")
    assert "Copyright (c) 2026 the aaa_celery authors" in text
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]


def test_one_version_in_the_metadata_the_package_and_the_changelog():
    assert PROJECT["version"] == aaa_celery.__version__ == "0.3.0.dev0"
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\S+)", changelog, re.M)
    assert headings[:3] == ["0.3.0", "0.2.0", "0.1.0"]
    # 0.1.0 was never tagged: the changelog names its commit, which travels with the history
    assert re.search(r"^## 0\.1\.0 .*c79799f", changelog, re.M)


def test_classifiers_and_project_urls():
    from trove_classifiers import classifiers as known

    classifiers = PROJECT["classifiers"]
    assert set(classifiers) <= known, set(classifiers) - known
    assert "Framework :: Celery" in classifiers
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "Programming Language :: Python :: 3.11" in classifiers  # requires-python
    # with an SPDX `license`, a licence classifier is refused by setuptools (PEP 639)
    assert not any(c.startswith("License ::") for c in classifiers)
    assert set(PROJECT["urls"]) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())
