"""Memory of a long-lived process: finished runs leave it (issue 15's memory test).

Reproduces on 88103e7: ``Engine.runs`` was never pruned, so every finished run (its handle,
events, task and outcome) stayed in memory for the life of the process: 30,000 finished runs
held. Now ``Engine.runs`` holds only the runs this process drives, the last ``keep_finished``
finished handles stay for ``get``, and the run records live in the store (the embedded memory
store keeps at most ``run_retention`` finished runs; durable stores purge after
``run_retention_s``).

``AAA_MEMORY_RUNS`` sets the number of runs (default 10,000, about 15 s here).
"""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.llm.fake import text
from aaa_celery.runtime import Engine
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.tools import ToolRegistry

RUNS = int(os.environ.get("AAA_MEMORY_RUNS", "10000"))


def test_ten_thousand_finished_runs_leave_memory_bounded():
    store = MemoryStore(run_retention=1000)
    figures: dict[str, float] = {}

    async def go() -> None:
        async with Engine(store=store, keep_finished=64) as engine:
            LLMHandler(FakeLLMClient(lambda request: text("done"))).attach(engine)
            algo = ToolLoop(ToolRegistry([]))
            tracemalloc.start()
            try:
                for n in range(1, RUNS + 1):
                    outcome = await engine.run(algo, {"task": f"task {n}"}, tenant="acme")
                    assert outcome.status == "completed"
                    if n == RUNS // 5:
                        gc.collect()
                        figures["after_first_fifth"] = tracemalloc.get_traced_memory()[0]
                gc.collect()
                figures["after_all"] = tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
            assert engine.runs == {}  # the runs this process drives: none now
            assert len(engine._finished) == 64  # the last finished handles, for get()
            assert len(store.list_runs(tenant="acme", limit=RUNS)) == 1000  # the store's retention
            latest = engine.list_runs(tenant="acme", limit=1)[0]
            assert latest.status == "completed" and latest.outcome.value["text"] == "done"
            oldest_id = f"{engine.list_runs(tenant='acme', limit=1000)[-1].run_id}"
            engine.forget(oldest_id, tenant="acme")
            assert len(store.list_runs(tenant="acme", limit=RUNS)) == 999

    asyncio.run(go())
    growth = figures["after_all"] - figures["after_first_fifth"]
    per_run = growth / (RUNS - RUNS // 5)
    print(f"\n{RUNS} finished runs: traced memory {figures['after_first_fifth'] / 1e6:.2f} MB after "
          f"{RUNS // 5}, {figures['after_all'] / 1e6:.2f} MB after {RUNS}: {growth / 1e6:+.2f} MB "
          f"({per_run:.0f} B a run) for the last {RUNS - RUNS // 5}")
    # bounded: the last 80% of the runs add (nearly) nothing; before, every run stayed (several KB each)
    assert per_run < 200, f"memory grows by {per_run:.0f} B a finished run"
