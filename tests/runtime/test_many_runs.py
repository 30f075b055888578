"""No pending approval is dropped, whatever the number of runs (issue 21, item 9).

Reproduces on c79799f: ``Engine.pending_approvals`` read at most 10,000 active runs from the
store, so the requests of any run beyond those were silently left out.
"""

from __future__ import annotations

import asyncio
import time

from aaa_celery.runtime import Engine
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.stores.runs import RunRecord, run_key


def test_pending_approvals_of_more_than_ten_thousand_runs_are_all_listed():
    store, now, n = MemoryStore(), time.time(), 10_050
    for i in range(n):
        run_id = f"run_{i:05d}"
        call_id = f"{run_key('acme', run_id)}:0.0.{i:016x}"
        store.put_run(RunRecord(run_id, "acme", "ToolLoop", {"task": "pay"}, "waiting", now - n + i, now, None, {
            call_id: {"run_id": run_id, "tenant": "acme", "call_id": call_id, "tool_call_id": None, "tool": "pay",
                      "arguments": {"n": i}, "since": now - n + i, "expires_at": now + 3600, "digest": f"d{i}",
                      "args_hash": "h", "state": "open", "reason": ""}}))

    async def main() -> int:
        async with Engine(store=store) as engine:
            return len(engine.pending_approvals())

    assert asyncio.run(main()) == n
