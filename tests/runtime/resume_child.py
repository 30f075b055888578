"""A process that drives one run on the embedded engine over an SQLite store, to be kill -9ed.

    python -m tests.runtime.resume_child <sqlite url> <run id> <plan: long|refund|secret>

0.1.0's interpreter runs it by path (``tests/runtime/test_resume_from_0_1_0.py``), so that
its own ``aaa_celery`` is imported, not this checkout's; the Fernet key of secret tools is
``AAA_SECRET_KEY``.
"""

from __future__ import annotations

import asyncio
import os
import sys

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import Engine
from aaa_celery.stores import open_store
from aaa_celery.tools import ToolHandler

if __package__:
    from .resume_tools import LONG_PLAN, REFUND_PLAN, REGISTRY, SECRET_PLAN, SECRET_REGISTRY, note, scripted
else:  # run by path, beside resume_tools.py
    from resume_tools import LONG_PLAN, REFUND_PLAN, REGISTRY, SECRET_PLAN, SECRET_REGISTRY, note, scripted  # type: ignore[no-redef]

PLANS = {"long": (LONG_PLAN, REGISTRY), "refund": (REFUND_PLAN, REGISTRY), "secret": (SECRET_PLAN, SECRET_REGISTRY)}


async def main(url: str, run_id: str, plan: str) -> None:
    steps, registry = PLANS[plan]
    engine = Engine(store=open_store(url), run_lease_s=1.0)
    if os.environ.get("AAA_SECRET_KEY"):
        engine.app.conf.aaa_secret_key = os.environ["AAA_SECRET_KEY"]
    LLMHandler(FakeLLMClient(scripted(*steps))).attach(engine)
    ToolHandler(registry).attach(engine)
    handle = engine.start(ToolLoop(registry), {"task": "refund A-100"}, run_id=run_id, tenant="acme")
    note("child.started", run_id=handle.run_id)
    await handle.result()
    note("child.done")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
