"""The upgrade from 0.1.0 (issue 20 item 5), on SQLite, PostgreSQL and Redis.

0.1.0 (commit c79799f, built from git history into a venv of its own: ``tests/old_release.py``)
writes a store holding calls in every state (``old_writer.py``), and keeps the running
call's lease live. This release then refuses the SQL stores (Redis: 0.1.0's keys are
format 1 already), ``celery -A ... aaa migrate`` upgrades them, and this release serves every call: finished calls keep their results, the
lapsed ones are found by recovery and taken over as their delivery policy says, the
OutcomeUnknown call stays in doubt, the checkpoint and the budget carry over, the run
still waits for its approval, and the live lease still holds until the 0.1.0 process
finishes its call on the upgraded store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aaa_celery.config import Delivery, GuardConfig
from aaa_celery.errors import OutcomeUnknown, StoreOutdated
from aaa_celery.guard import GuardRunner
from aaa_celery.lifecycle import Busy, CallSpec, Checkpoint, Outcome
from aaa_celery.stores import open_store
from aaa_celery.stores.base import check_version

from ..old_release import ROOT, env

WRITER = Path(__file__).with_name("old_writer.py")
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]


def spec(call_id: str) -> CallSpec:  # as old_writer.py sends it
    request = {"task": "refund", "args": [], "kwargs": {"order": call_id}, "queue": "celery"}
    return CallSpec(call_id, "refund", f"key/{call_id}", request)


def migrate(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.cli.cli_app aaa migrate`` of this release, on the store at ``url``."""
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.cli.cli_app", "aaa", "migrate", *args],
                          env={**os.environ, "AAA_CLI_STORE": url}, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def never(attempt: int) -> None:
    raise AssertionError(f"a call with a result ran again (attempt {attempt})")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_store_0_1_0_wrote_is_migrated_and_every_call_served(old_release, request, backend, tmp_path):
    url = {"sqlite": f"sqlite:///{tmp_path / 'aaa.sqlite3'}"}.get(backend) or request.getfixturevalue(
        "postgres_url" if backend == "postgresql" else "redis_url")
    writer = subprocess.Popen([str(old_release.python), str(WRITER), url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=tmp_path)
    try:
        line = writer.stdout.readline()  # type: ignore[union-attr]
        assert line, writer.stderr.read()  # type: ignore[union-attr]
        wrote = json.loads(line)
        assert wrote["module"].startswith(str(old_release.venv))  # 0.1.0's code wrote it
        ids = wrote["ids"]

        if backend == "redis":  # 0.1.0's keys are format 1: nothing to upgrade, migrate writes the key
            with open_store(url) as store:
                assert (store.schema_version().current, store.schema_version().outdated) == ("1", False)
            assert migrate(url, "--check").returncode == 0
        else:
            # This release will not run on the store as 0.1.0 left it ...
            with open_store(url) as store:
                assert store.schema_version().current is None
                with pytest.raises(StoreOutdated, match="aaa migrate"):
                    check_version(store, auto_migrate=False)
            # ... until `aaa migrate` upgrades it (with 0.1.0's process still holding its lease).
            check = migrate(url, "--check")
            assert check.returncode == 1 and "0.1.0 (unversioned), this release needs" in check.stdout, check
            done = migrate(url)
            assert done.returncode == 0, done.stderr
            assert "0.1.0 (unversioned) ->" in done.stdout
        assert "already current" in migrate(url).stdout
        assert migrate(url, "--check").returncode == 0

        with open_store(url) as store:
            assert check_version(store, auto_migrate=False).current is not None
            if backend != "redis":  # the recovery sweep's indexes (0002), beside 0.1.0's live lease
                import sqlalchemy as sa

                found = {i["name"] for i in sa.inspect(store.engine).get_indexes("aaa_calls")}  # type: ignore[attr-defined]
                assert {"ix_aaa_calls_lease_expires_at", "ix_aaa_calls_unclaimed"} <= found
            alo = GuardRunner(store, GuardConfig(delivery=Delivery.AT_LEAST_ONCE, max_attempts=3, lease_ttl_s=5.0))
            amo = GuardRunner(store, GuardConfig(delivery=Delivery.AT_MOST_ONCE, lease_ttl_s=5.0))

            # Finished calls keep their results; the call in doubt stays in doubt.
            assert alo.run(spec(ids["completed"]), "new-w1", never) == {"refunded": ids["completed"]}
            with pytest.raises(ValueError, match="card declined"):
                alo.run(spec(ids["failed"]), "new-w1", never)
            with pytest.raises(OutcomeUnknown):
                amo.run(spec(ids["unknown"]), "new-w1", never)

            # Recovery finds the lapsed calls, never the running or finished ones ...
            lapsed = {c.call_id for c in store.expired(unclaimed_grace_s=3600.0)}
            assert {ids["lapsed"], ids["checkpointed"]} <= lapsed
            assert not lapsed & {ids["running"], ids["completed"], ids["failed"], ids["handed_on"]}
            # ... and at_least_once takes them over as attempt 2, the checkpoint carried over.
            ran: list[tuple[int, Checkpoint | None]] = []

            def body(attempt: int, call_id: str) -> str:
                ran.append((attempt, store.last_checkpoint(call_id)))
                return f"done {attempt}"

            assert alo.run(spec(ids["lapsed"]), "new-w1", lambda n: body(n, ids["lapsed"])) == "done 2"
            assert alo.run(spec(ids["checkpointed"]), "new-w1", lambda n: body(n, ids["checkpointed"])) == "done 2"
            assert ran == [(2, None), (2, Checkpoint(1, {"page": 7}))]
            # The call handed on is claimed by its next delivery as attempt 2 (not a lost one).
            assert alo.run(spec(ids["handed_on"]), "new-w1", lambda n: n) == 2

            # The live lease of 0.1.0's process still holds the running call.
            busy = store.begin(spec(ids["running"]), "new-w2", GuardConfig(lease_ttl_s=5.0))
            assert isinstance(busy, Busy) and busy.holder == "old-w1", busy

            # The budget carries its spend; the run waits for its approval.
            assert not store.spend(wrote["budget"], "t2", 5.0, 10.0, 3600.0)
            assert store.spend(wrote["budget"], "t3", 4.0, 10.0, 3600.0)
            run = store.get_run(wrote["run"])
            assert run is not None and run.status == "waiting" and run.events == 1
            assert run.approvals[wrote["approval"]]["state"] == "open"
            assert store.decide_approval(wrote["run"], wrote["approval"], "d" * 64, {"granted": True, "by": "ops"})

            # 0.1.0's process finishes its call on the upgraded store, and this release reads it.
            writer.stdin.write("finish\n")  # type: ignore[union-attr]
            writer.stdin.flush()  # type: ignore[union-attr]
            assert json.loads(writer.stdout.readline()) == {"finished": "Accepted"}  # type: ignore[union-attr]
            assert writer.wait(30) == 0
            assert store.result(ids["running"]) == Outcome.success({"refunded": ids["running"]}, 1)
            assert alo.run(spec(ids["running"]), "new-w1", never) == {"refunded": ids["running"]}
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
