"""A run 0.1.0 drove, resumed by this release: its calls of secret tools are not sent again.

0.1.0 (commit c79799f) minted a call's id from a digest of the model's raw arguments; this
release leaves secret parameters out of it (0800fc7, issue 21 item 1), so a replayed call
of a tool with a secret got another id than the one 0.1.0 sent it with, found no recorded
result, and its effect ran twice. Reproduces on c172e82: the unlock ran in 0.1.0's process
and again here. Now a resumed run finds the call under the id 0.1.0 gave it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.protocol import mint_call_id
from aaa_celery.runtime import APPROVAL_GRANTED, Engine
from aaa_celery.stores import open_store
from aaa_celery.tools import ToolHandler

from ..old_release import env
from .conftest import kill_9_when, until
from .resume_tools import LOG_ENV, SECRET_PLAN, SECRET_REGISTRY, notes, scripted

CHILD = Path(__file__).with_name("resume_child.py")
KEY = "uXuV2bCkT0C8y1pQy0mCkM1S1n8cGqkJ8t0oQmGQnVs="  # a Fernet key, the same in both releases


def unlock_ids(events: list[dict]) -> set[str]:
    """The call ids the run's unlock was requested under (by every process that drove it)."""
    return {e["data"]["call_id"] for e in events
            if e["type"] == "aaa.tool.requested" and e["data"]["name"] == "unlock"}


@pytest.fixture(autouse=True)
def _log(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(LOG_ENV, str(tmp_path / "log.jsonl"))


@pytest.mark.timeout(600)
def test_a_run_0_1_0_drove_does_not_run_its_secret_call_again_when_this_release_resumes_it(old_release, tmp_path):
    url, run_id = f"sqlite:///{tmp_path / 'aaa.sqlite3'}", "r-upgrade"
    # Given 0.1.0 driving a run: the unlock (a secret PIN) ran, the refund waits for a person ...
    child = subprocess.Popen([str(old_release.python), str(CHILD), url, run_id, "secret"], cwd=tmp_path,
                             env=env({LOG_ENV: os.environ[LOG_ENV], "AAA_SECRET_KEY": KEY}),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with open_store(url) as store:  # read only, as 0.1.0 wrote it

        def waiting() -> bool:
            run = store.get_run(f"acme:{run_id}") if notes("unlock") else None
            return run is not None and any(a.get("state") == "open" for a in run.approvals.values())

        # ... when its process dies (an upgrade that did not wait for the run).
        kill_9_when(child, waiting, 120, "the refund's approval")
    assert [n["pid"] for n in notes("unlock")] == [child.pid]
    with open_store(url) as store:
        store.migrate()

    async def go() -> None:
        # This release resumes the run on the upgraded store
        engine = Engine(store=open_store(url), run_lease_s=3.0)
        engine.app.conf.aaa_secret_key = KEY
        LLMHandler(FakeLLMClient(scripted(*SECRET_PLAN))).attach(engine)
        ToolHandler(SECRET_REGISTRY).attach(engine)
        await until(engine.orphaned_runs, timeout_s=30, what="the dead 0.1.0 run is orphaned")
        handle = engine.resume(run_id, ToolLoop(SECRET_REGISTRY), tenant="acme")
        [pending] = await until(handle.pending_approvals, what="the resumed run waits for the same refund")
        await asyncio.to_thread(handle.signal, APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest})
        outcome = await asyncio.wait_for(handle.result(), 60)
        # Then the unlock did not run again: its recorded result is the run's fact
        assert outcome.status == "completed", outcome
        assert outcome.value["text"] == "done: unlocked bob | refunded 30 EUR on A-100"
        assert [n["pid"] for n in notes("unlock")] == [child.pid]
        # (the id 0.1.0 minted, of the raw arguments: the one the store knows the call by)
        assert unlock_ids(handle.events()) == {mint_call_id("acme", run_id, 0, 0, "unlock",
                                                            {"user": "bob", "pin": "4821"})}
        assert [n["pid"] for n in notes("refund")] == [os.getpid()]
        assert [n["turn"] for n in notes("model")] == [0, 1, 2]  # 0.1.0 asked 0 and 1, this release 2
        # Driving the run id again asks the model again; the unlock still finds its record
        again = engine.start(ToolLoop(SECRET_REGISTRY), {"task": "x"}, run_id=run_id, tenant="acme")
        assert (await asyncio.wait_for(again.result(), 60)).value["text"] == outcome.value["text"]
        assert len(notes("unlock")) == 1 and len(notes("refund")) == 1
        await engine.aclose()

    asyncio.run(go())


def test_a_run_this_release_drove_keeps_its_secret_free_ids_when_resumed(tmp_path):
    url, run_id = f"sqlite:///{tmp_path / 'aaa.sqlite3'}", "r-new"

    def engine() -> Engine:
        made = Engine(store=open_store(url), run_lease_s=1.0)
        made.app.conf.aaa_secret_key = KEY
        LLMHandler(FakeLLMClient(scripted(*SECRET_PLAN))).attach(made)
        ToolHandler(SECRET_REGISTRY).attach(made)
        return made

    async def go() -> None:
        a = engine()
        started = a.start(ToolLoop(SECRET_REGISTRY), {"task": "x"}, run_id=run_id, tenant="acme")
        await until(started.pending_approvals, what="the refund waits for a person")
        [first] = unlock_ids(started.events())
        assert "4821" not in first and first == mint_call_id(
            "acme", run_id, 0, 0, "unlock", {"user": "bob", "pin": "**********"})
        started._lost = True  # its driver dies: it writes nothing more and keeps its lease until it lapses
        started._task.cancel()
        b = engine()
        await until(b.orphaned_runs, timeout_s=30, what="the run is orphaned")
        handle = b.resume(run_id, ToolLoop(SECRET_REGISTRY), tenant="acme")
        [pending] = await until(handle.pending_approvals, what="the resumed run waits for the refund")
        await asyncio.to_thread(handle.signal, APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest})
        assert (await asyncio.wait_for(handle.result(), 60)).status == "completed"
        assert unlock_ids(handle.events()) == {first} and len(notes("unlock")) == 1
        for made in (a, b):
            await made.aclose()

    asyncio.run(go())
