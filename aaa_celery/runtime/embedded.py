"""The embedded default: an in-process Celery worker thread on the in-memory broker.

This module holds the only process-wide tweaks the engine makes, both needed
because the worker shares the app's process:

* the embedded app becomes Celery's default app (the threads pool resolves tasks
  through it);
* Celery's "inside a task" flag, which a worker sets for the whole process, is
  cleared, so the process's own code (a script, a test) can still wait on results.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery
from celery.result import _set_task_join_will_block  # type: ignore[attr-defined]  # Celery's own, not in celery-types


def embedded_app(engine_id: str) -> Celery:
    """A Celery app on the in-memory broker, result backend and store, JSON only."""
    app = Celery(f"aaa-embedded-{engine_id}", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(
        # a store of this engine's own (one per URL and process)
        aaa_store_url=f"memory://aaa-embedded-{engine_id}",
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        worker_prefetch_multiplier=1,
        task_default_queue=f"aaa-embedded-{engine_id}",
        aaa_recovery_interval_s=1.0,
        broker_transport_options={"polling_interval": 0.05},
    )
    return app


class EmbeddedWorker:
    """A Celery worker (threads pool) running in a daemon thread of this process."""

    def __init__(self, app: Celery, name: str, concurrency: int) -> None:
        from celery.contrib.testing.worker import TestWorkController

        app.finalize()
        app.set_default()
        queues = [q.name for q in app.conf.task_queues or []] or [app.conf.task_default_queue]
        self.controller: Any = TestWorkController(
            app=app,
            concurrency=concurrency,
            pool="threads",
            hostname=f"{name}@localhost",
            loglevel="WARNING",
            queues=queues,
            ready_callback=None,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(target=self.controller.start, name=name, daemon=True)
        self._thread.start()
        self.controller.ensure_started()
        _set_task_join_will_block(False)

    def add_queues(self, queues: list[str]) -> None:
        """Consume more queues (tools attached after the worker started)."""
        consumer = self.controller.consumer
        consumer.update_strategies()
        for queue in queues:
            consumer.add_task_queue(queue)

    def stop(self) -> None:
        self.controller.stop(in_sighandler=False)
        # Celery's sync loop polls the in-memory broker in 2 s slices; the stopped
        # worker's daemon thread ends on its own at the next one, owning nothing.
        self._thread.join(0.2)
