"""``examples/refund.py --model openai|anthropic`` runs the spec's example against a real
client; here the "real" server is the stub, reached through the vendor's URL variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Vendor, echo_results

ROOT = Path(__file__).resolve().parents[2]
URL_ENV = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


def _example(*args: str, env: dict[str, str], drop: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "refund.py"), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != drop}, "PYTHONPATH": str(ROOT), **env},
    )


def test_the_example_with_model_runs_against_the_vendors_api(vendor: Vendor):
    first = vendor.calls(("toolu_refund_1", "refund", {"order_id": "A-100"}))
    with vendor.server(echo_results(vendor, first)) as server:
        out = _example("--model", vendor.name, env={URL_ENV[vendor.name]: server.base_url, "AAA_MODEL": "stub-model"})

    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "refund  -> at_most_once | max_attempts = 3",
        "search  -> at_least_once | max_attempts = 3",
        "refunded A-100 (key=refund:A-100, attempt=1, fence=1)",
    ]
    assert len(server.requests) == 2
    assert {b["model"] for b in server.bodies} == {"stub-model"}
    assert [t.get("name") or t["function"]["name"] for t in server.bodies[0]["tools"]] == ["refund", "search"]


@pytest.mark.parametrize("name", ["openai", "anthropic"])
def test_the_example_with_model_and_no_key_says_which_variable_to_set(name: str):
    key_env = f"{name.upper()}_API_KEY"
    out = _example("--model", name, env={}, drop=key_env)
    assert out.returncode == 1 and out.stdout == ""
    assert f"--model {name}: set {key_env}" in out.stderr
