"""The embedded engine must not change how the rest of its process uses Celery."""

from __future__ import annotations

import asyncio

from celery import Celery
from celery.result import task_join_will_block

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.llm.fake import text
from aaa_celery.runtime import Engine
from aaa_celery.tools import ToolRegistry


def test_after_an_embedded_run_the_process_may_still_wait_on_celery_results():
    async def main() -> None:
        async with Engine() as engine:
            LLMHandler(FakeLLMClient([text("done")])).attach(engine)
            await engine.run(ToolLoop(ToolRegistry([])), {"task": "x"})

    asyncio.run(main())
    # Celery's worker sets a process-wide "inside a task" flag; left set, any later
    # AsyncResult.get() in this process raises "Never call result.get() within a task!"
    assert task_join_will_block() is False
    app = Celery("probe", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(name="probe.seven")
    def seven() -> int:
        return 7

    assert seven.delay().get(timeout=5) == 7
