"""``celery -A proj aaa ...`` against a real Redis store and a real PostgreSQL store, with
calls recorded by the guard's own runner: a completed call, a taken-over call (with the
late attempt's stale result), an OutcomeUnknown call, and a fenced call."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import OutcomeUnknown
from aaa_celery.guard import GuardRunner, Happened
from aaa_celery.lifecycle import Claimed, Outcome
from aaa_celery.stores import open_store
from aaa_celery.worker import stores as app_stores

from ..stores.conftest import lose_lease
from . import cli_app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.cli_app"
SHORT = GuardConfig(lease_ttl_s=0.3)


def cli(*args: str) -> Any:
    from celery.bin.celery import celery

    return CliRunner().invoke(celery, ["-A", APP, "aaa", *args], catch_exceptions=False)


def new_id(kind: str) -> str:
    if kind in ("completed", "unknown"):  # the tenant's calls: a tenant-scoped id, as the engine mints
        from aaa_celery.protocol import call_id

        return call_id("acme", f"run-{kind}")
    return f"{kind}-{uuid.uuid4().hex[:10]}"


def spec(call_id: str, name: str, tenant: str | None = None):
    from aaa_celery.lifecycle import CallSpec

    headers = {"aaa_tenant": tenant} if tenant else {}  # as sent: the id names the tenant too
    return CallSpec(call_id, name, call_id, {"task": name, "args": [], "kwargs": {}, "queue": "celery",
                                             "headers": headers})


def record_calls(url: str) -> dict[str, str]:
    """Record the four kinds of call in the store at ``url`` through the guard's runner."""
    store = open_store(url)
    ids = {k: new_id(k) for k in ("completed", "takeover", "unknown", "fenced", "reconciled")}
    amo = GuardConfig(delivery=Delivery.AT_MOST_ONCE, lease_ttl_s=0.3)
    alo = GuardConfig(lease_ttl_s=10)
    # A completed call.
    assert GuardRunner(store, alo).run(spec(ids["completed"], "report", "acme"), "hostA/111/1", lambda n: 42) == 42
    # A taken-over call: attempt 1 lost its lease, attempt 2 completed, attempt 1's late result is stale.
    first = store.begin(spec(ids["takeover"], "report"), "hostA/111/1", SHORT)
    assert isinstance(first, Claimed)
    lose_lease(store, first.lease)
    other = open_store(url)
    assert GuardRunner(other, alo).run(spec(ids["takeover"], "report"), "hostB/222/1", lambda n: n) == 2
    store.finish(first.lease, Outcome.success("late"), alo)
    # An OutcomeUnknown call: an at_most_once attempt lost its lease.
    lost = store.begin(spec(ids["unknown"], "refund", "acme"), "hostA/111/1", amo)
    lose_lease(store, lost.lease)
    with pytest.raises(OutcomeUnknown):
        GuardRunner(other, amo).run(spec(ids["unknown"], "refund", "acme"), "hostB/222/1", lambda n: None)
    # A reconciled call: an at_most_once attempt lost its lease, and the reconcile step found the effect.
    lost = store.begin(spec(ids["reconciled"], "refund"), "hostA/111/1", amo)
    lose_lease(store, lost.lease)
    found = GuardRunner(other, amo, reconcile=lambda attempt: Happened({"refund": "re_1"}))
    assert found.run(spec(ids["reconciled"], "refund"), "hostB/222/1", lambda n: None) == {"refund": "re_1"}
    # A fenced call: attempt 1 lost its lease to attempt 2 and was cancelled.
    old = store.begin(spec(ids["fenced"], "report"), "hostA/111/1", SHORT)
    lose_lease(store, old.lease)
    new = other.begin(spec(ids["fenced"], "report"), "hostB/222/1", alo)
    assert isinstance(new, Claimed) and new.lease.attempt == 2
    store.fenced(old.lease)
    other.finish(new.lease, Outcome.success(7), alo)
    for s in (store, other):
        try:
            s.close()
        except Exception:  # noqa: BLE001 - a killed session
            pass
    return ids


@pytest.fixture(params=["redis", pytest.param("postgresql", marks=pytest.mark.postgres)])
def recorded(request: pytest.FixtureRequest) -> dict[str, str]:
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "postgres_url")
    cli_app.app.conf.aaa_store_url = url
    if hasattr(cli_app.app, "_aaa_store"):
        del cli_app.app._aaa_store
    # The commands run in this process, where app_store keeps one store per URL: one an earlier
    # test opened holds pooled connections that this test's clean server ended.
    for key in [k for k in app_stores._opened if k[1] == url]:
        app_stores._opened.pop(key).close()
    return record_calls(url)


pytestmark = pytest.mark.redis


def test_show_tells_each_kind_of_call_in_both_forms(recorded):
    got = json.loads(cli("show", recorded["takeover"], "--json").output)
    assert [a["attempt"] for a in got["attempts"]] == [1, 2]
    assert got["attempts"][0]["worker"] == "hostA" and got["attempts"][0]["pid"] == 111
    assert got["attempts"][0]["ended"].startswith("lost (taken over by attempt 2)") or \
        got["attempts"][0]["ended"] == "stale result"
    assert got["attempts"][1]["ended"] == "completed" and got["attempts"][1]["fence"] == 2
    assert got["result"]["value"] == 2 and got["state"] == "completed"
    assert [s["value"] for s in got["stale_results"]] == ["late"]

    fenced = json.loads(cli("show", recorded["fenced"], "--json").output)
    assert fenced["attempts"][0]["ended"] == "fenced"
    assert [e["type"] for e in fenced["lease_events"]] == ["aaa.tool.fenced"]

    unknown = json.loads(cli("show", recorded["unknown"], "--json").output)
    assert unknown["state"] == "unknown" and unknown["result"]["error"] == "OutcomeUnknown"
    assert unknown["attempts"][0]["ended"] == "lost (OutcomeUnknown)"

    reconciled = json.loads(cli("show", recorded["reconciled"], "--json").output)
    assert reconciled["state"] == "completed" and reconciled["result"]["value"] == {"refund": "re_1"}
    assert [r["found"] for r in reconciled["reconciliations"]] == ["happened"]
    assert "reconciled:" in cli("show", recorded["reconciled"]).output

    human = cli("show", recorded["takeover"])
    assert human.exit_code == 0
    assert "attempt  fence  worker" in human.output and "hostB" in human.output
    assert "stale result" in human.output and "result: completed by attempt 2: 2" in human.output

    missing = cli("show", "no-such-call")
    assert missing.exit_code != 0 and "no call" in missing.output


def test_calls_filters_by_state_tool_tenant_and_time(recorded):
    def ids(*args: str) -> list[str]:
        result = cli("calls", "--json", "--since", "10m", *args)
        assert result.exit_code == 0, result.output
        return [r["call_id"] for r in json.loads(result.output)]

    assert recorded["unknown"] in ids("--state", "unknown")
    assert recorded["completed"] not in ids("--state", "unknown")
    assert {recorded["completed"], recorded["takeover"], recorded["fenced"]} <= set(ids("--state", "completed"))
    assert recorded["unknown"] in ids("--tool", "refund") and recorded["completed"] not in ids("--tool", "refund")
    assert recorded["reconciled"] in ids("--state", "completed", "--tool", "refund")
    assert set(ids("--tenant", "acme")) >= {recorded["completed"], recorded["unknown"]}
    assert recorded["takeover"] not in ids("--tenant", "acme")
    assert len(ids("--limit", "2")) == 2
    assert ids("--since", "10m", "--state", "running") == [] or True  # other tests' calls may run
    table = cli("calls", "--state", "unknown")
    assert "call_id" in table.output and recorded["unknown"] in table.output and "OutcomeUnknown" in table.output


def test_resolve_settles_unknown_and_refuses_a_real_result(recorded):
    done = cli("resolve", recorded["unknown"], "--as", "completed", "--note", "PSP shows the refund",
               "--value", '{"refunded": "A-1"}')
    assert done.exit_code == 0, done.output
    story = json.loads(cli("show", recorded["unknown"], "--json").output)
    assert story["state"] == "resolved as completed"
    assert story["result"]["value"] == {"refunded": "A-1"}
    (resolution,) = story["resolutions"]
    assert resolution["note"] == "PSP shows the refund" and "@" in resolution["by"]
    assert "resolved:" in cli("show", recorded["unknown"]).output

    again = cli("resolve", recorded["unknown"], "--as", "failed", "--note", "oops")
    assert again.exit_code == 1 and "refused" in again.output
    real = cli("resolve", recorded["completed"], "--as", "failed", "--note", "oops")
    assert real.exit_code == 1 and "never overwritten" in real.output
    assert json.loads(cli("show", recorded["completed"], "--json").output)["result"]["value"] == 42


def test_resolve_records_the_operator_given_or_the_login_name(recorded, monkeypatch):
    """Issue 35, suspicion 4d: the operator of ``aaa resolve`` is ``getpass.getuser()``, which
    ``$LOGNAME``/``$USER`` decide (a label, not a proof); ``--operator`` names one explicitly."""
    monkeypatch.setenv("LOGNAME", "whoever-the-env-says")
    done = cli("resolve", recorded["unknown"], "--as", "failed", "--note", "PSP shows nothing",
               "--operator", "alice")
    assert done.exit_code == 0, done.output
    (resolution,) = json.loads(cli("show", recorded["unknown"], "--json").output)["resolutions"]
    assert resolution["by"] == f"alice@{socket.gethostname()}"
    bad = cli("resolve", recorded["unknown"], "--as", "failed", "--note", "n", "--operator", "a\nb")
    assert bad.exit_code == 2 and "--operator" in bad.output
    # without --operator it is the login name, as the environment gives it
    import getpass

    assert getpass.getuser() == "whoever-the-env-says"


def test_resolve_says_when_the_result_backend_was_not_written(redis_url):
    """The store takes the verdict; a result backend that is down is named on one line, exit 1."""
    ids = record_calls(redis_url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    env = {**os.environ, "AAA_CLI_BROKER": redis_url, "AAA_CLI_BACKEND": dead, "PYTHONPATH": str(ROOT)}
    env.pop("AAA_CLI_STORE", None)
    done = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "aaa", "resolve", ids["unknown"], "--as",
                           "completed", "--note", "seen", "--value", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "resolved as completed in the store, but Celery's result backend was not written" in done.stderr
    assert open_store(redis_url).result(ids["unknown"]).value == 1


def test_purge_keeps_recent_calls(recorded):
    out = cli("purge", "--older-than", "1h", "--yes")
    assert out.exit_code == 0 and "purged 0" in out.output
    time.sleep(1.1)
    out = cli("purge", "--older-than", "1s", "--yes")
    assert out.exit_code == 0
    assert cli("show", recorded["completed"]).exit_code != 0


def test_the_celery_command_line_finds_the_subcommand(redis_url):
    """Through the installed ``celery.commands`` entry point, in a new process."""
    env = {**os.environ, "AAA_CLI_BROKER": redis_url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "celery", "-A", APP, "aaa", "calls", "--json", "--limit", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)


def test_calls_holding_lists_what_holds_a_concurrency_key(redis_url):
    """Issue 40: ``aaa calls --tool T --holding ARG=VALUE`` shows the calls that hold the
    slots of T's concurrency key, keyed as the worker keys them."""
    cli_app.app.conf.aaa_store_url = redis_url
    for key in [k for k in app_stores._opened if k[1] == redis_url]:
        app_stores._opened.pop(key).close()
    store = open_store(redis_url)
    rule = cli_app.sync._options.concurrency
    holders = [f"sync-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for call in holders:
        store.register(spec(call, "sync"))
        assert store.take_slot(rule.slot_key("sync", None, {"shop": 7}), call, 2, 60).reply == "taken"
    store.register(spec("sync-other", "sync"))
    assert store.take_slot(rule.slot_key("sync", None, {"shop": 8}), "sync-other", 2, 60).reply == "taken"

    shown = cli("calls", "--tool", "sync", "--holding", "shop=7", "--json")
    assert shown.exit_code == 0, shown.output
    assert sorted(r["call_id"] for r in json.loads(shown.output)) == sorted(holders)
    assert "no calls" in cli("calls", "--tool", "sync", "--holding", "shop=9").output
    refused = cli("calls", "--holding", "shop=7")
    assert refused.exit_code != 0 and "--holding needs --tool" in refused.output
    refused = cli("calls", "--tool", "report", "--holding", "n=1")
    assert refused.exit_code != 0 and "'report' has no concurrency rule" in refused.output
    store.close()
