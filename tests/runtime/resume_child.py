"""A process that drives one run on the embedded engine over an SQLite store, to be kill -9ed.

    python -m tests.runtime.resume_child <sqlite url> <run id> <plan: long|refund>
"""

from __future__ import annotations

import asyncio
import sys

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import Engine
from aaa_celery.stores import open_store
from aaa_celery.tools import ToolHandler

from .resume_tools import LONG_PLAN, REFUND_PLAN, REGISTRY, note, scripted


async def main(url: str, run_id: str, plan: str) -> None:
    engine = Engine(store=open_store(url), run_lease_s=1.0)
    LLMHandler(FakeLLMClient(scripted(*(LONG_PLAN if plan == "long" else REFUND_PLAN)))).attach(engine)
    ToolHandler(REGISTRY).attach(engine)
    handle = engine.start(ToolLoop(REGISTRY), {"task": "refund A-100"}, run_id=run_id, tenant="acme")
    note("child.started", run_id=handle.run_id)
    await handle.result()
    note("child.done")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
