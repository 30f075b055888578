"""examples/pydantic_ai_refund.py, as docs/pydantic-ai.md tells a reader to run it: offline, no server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

ROOT = Path(__file__).resolve().parents[2]


def test_the_pydantic_ai_example_runs_offline_and_prints_its_story():
    done = subprocess.run([sys.executable, "examples/pydantic_ai_refund.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("approval asked: wire({'to': 'ACME', 'amount_cents': 100}), digest ")
    answer = "['A-100: paid 3000 cents on 2026-11-30'] | refunded 3000 cents on A-100 | wired 100 cents to ACME"
    assert lines[1:] == [f"agent: {answer}", f"again: {answer}", "same output with and without the guard: True"]
