"""examples/effects_refund.py runs as a user runs it, and shows one refund per order; the Django
migration of the effect tables matches its models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_effects_refund_example_runs_and_refunds_each_order_once():
    done = subprocess.run([sys.executable, "examples/effects_refund.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == lines[1].replace("asked again:", "refund:")
    assert lines[2].startswith("stale attempt refused: fence 1 for 'c-7' is stale (highest seen: 2)")
    assert lines[3:] == ["order A-100: refunded 500 cents in 1 refund(s)",
                         "order B-7: refunded 300 cents in 1 refund(s)"]


def test_the_django_migration_matches_the_models():
    # makemigrations in a user's project must find nothing to add to aaa_celery's app
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", "django", "makemigrations", "--check", "--dry-run",
                           "aaa_celery"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "DJANGO_SETTINGS_MODULE": "tests.effects.django_settings"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No changes detected in app 'aaa_celery'" in done.stdout
