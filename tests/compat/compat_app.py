"""One Celery app, run plain or with every task guarded, for the compatibility tests.

``AAA_COMPAT_GUARDED=1`` makes ``GuardedTask`` the app's ``task_cls``, so the very same
task definitions run guarded; otherwise every task is a plain ``acks_late`` task. The
tests assert the same observable behaviour in both modes.

- ``AAA_COMPAT_BROKER``: broker, result backend and store (a Redis URL).
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery

from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool


class CompatError(Exception):
    """An exception of the app's own (not a builtin): Celery rebuilds it by module and name."""


def make_app(env: Mapping[str, str]) -> Celery:
    broker = env["AAA_COMPAT_BROKER"]
    guarded = env.get("AAA_COMPAT_GUARDED") == "1"
    app = Celery("compat_app", broker=broker, backend=broker,
                 task_cls="aaa_celery.worker:GuardedTask" if guarded else "celery.app.task:Task")
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        result_expires=600,
        aaa_guard={"lease_ttl_s": 3, "wait_poll_s": 0.25},
        aaa_recovery_interval_s=1,
        aaa_unclaimed_grace_s=2,
    )
    ledger: Any = None

    def record(event: str, task_id: str, **fields: Any) -> None:
        nonlocal ledger
        from aaa_celery.testing import Ledger

        if ledger is None or ledger._redis.connection_pool.pid != os.getpid():
            ledger = Ledger(broker)
        ledger.record(event, task_id=task_id, pid=os.getpid(), **fields)

    @app.task(bind=True, shared=False, name="compat.whoami")
    def whoami(self: Any, x: int) -> dict[str, Any]:
        return {"id": self.request.id, "x": x, "retries": self.request.retries}

    @app.task(shared=False, name="compat.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(shared=False, name="compat.rich")
    def rich() -> dict[str, Any]:
        return {"when": dt.datetime(2026, 1, 2, 3, 4, 5), "amount": decimal.Decimal("12.50")}

    @app.task(bind=True, shared=False, name="compat.slow")
    def slow(self: Any, seconds: float, tag: str) -> str:
        record("start", self.request.id)
        time.sleep(seconds)
        return tag

    @app.task(bind=True, shared=False, name="compat.append")
    def append(self: Any, text: str, tag: str) -> str:
        record("start", self.request.id)
        return f"{text}+{tag}"

    @app.task(bind=True, shared=False, name="compat.flaky", delivery="at_most_once")
    def flaky(self: Any, retries: int) -> int:
        record("start", self.request.id)
        if self.request.retries < retries:
            raise self.retry(countdown=0.5, max_retries=5)
        return self.request.retries

    @app.task(bind=True, shared=False, name="compat.auto", autoretry_for=(KeyError,),
              retry_kwargs={"max_retries": 2, "countdown": 0.3})
    def auto(self: Any) -> int:
        record("start", self.request.id)
        if self.request.retries < 2:
            raise KeyError("not yet")
        return self.request.retries

    @app.task(bind=True, shared=False, name="compat.ignored")
    def ignored(self: Any) -> None:
        from celery.exceptions import Ignore

        record("start", self.request.id)
        raise Ignore()

    @app.task(bind=True, shared=False, name="compat.rejected")
    def rejected(self: Any) -> None:
        from celery.exceptions import Reject

        record("start", self.request.id)
        raise Reject("not for us", requeue=False)

    @app.task(bind=True, shared=False, name="compat.replaced")
    def replaced(self: Any, x: int) -> Any:
        record("start", self.request.id)
        return self.replace(add.s(x, 100))

    @app.task(bind=True, shared=False, name="compat.progress")
    def progress(self: Any) -> str:
        self.update_state(state="PROGRESS", meta={"done": 1})
        time.sleep(1.5)
        return "ok"

    @app.task(shared=False, name="compat.total")
    def total(values: list[int]) -> int:
        return sum(values)

    class Hooked(app.Task):  # type: ignore[misc,name-defined]
        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
            record("on_success", task_id)

        def on_failure(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            record("on_failure", task_id)

        def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            record(f"after_return:{status}", task_id)

        def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            record("on_retry", task_id)

    @app.task(base=Hooked, shared=False, name="compat.hooked")
    def hooked(fail: bool) -> str:
        if fail:
            raise ValueError("on purpose")
        return "fine"

    @tool
    def refund(order_id: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Refund an order (a tool, sent through its task handle)."""
        record("start", ctx.call_id)
        return {"order_id": order_id, "amount": amount, "attempt": ctx.attempt, "guarded": ctx.guarded}

    app.tools_handler = ToolHandler(ToolRegistry([refund]))  # type: ignore[attr-defined]
    app.tools_handler.bind(app)  # type: ignore[attr-defined]

    @app.task(bind=True, shared=False, name="compat.soft", soft_time_limit=1)
    def soft(self: Any) -> str:
        from celery.exceptions import SoftTimeLimitExceeded

        try:
            time.sleep(5)
        except SoftTimeLimitExceeded:
            return "soft limit reached the body"
        return "no limit"

    @app.task(bind=True, shared=False, name="compat.hard", time_limit=2)
    def hard(self: Any) -> str:
        record("start", self.request.id)
        time.sleep(30)
        return "no limit"

    @app.task(bind=True, shared=False, name="compat.hard_once", time_limit=2, delivery="at_most_once")
    def hard_once(self: Any) -> str:
        record("start", self.request.id)
        time.sleep(30)
        return "no limit"

    @app.task(bind=True, shared=False, name="compat.tracked", track_started=True)
    def tracked(self: Any) -> str:
        time.sleep(1.5)
        return "tracked"

    @app.task(shared=False, name="compat.quiet", ignore_result=True)
    def quiet(task_id: str) -> str:
        record("start", task_id)
        return "unseen"

    @app.task(shared=False, name="compat.boom")
    def boom() -> None:
        raise ValueError("boom")

    @app.task(shared=False, name="compat.boom_own")
    def boom_own() -> None:
        raise CompatError("boom", 42)

    @app.task(shared=False, name="compat.on_error")
    def on_error(request: Any, exc: Any, traceback: Any) -> None:
        record("errback", request.id, error=type(exc).__name__)

    @app.task(bind=True, base=Hooked, shared=False, name="compat.hooked_retry")
    def hooked_retry(self: Any) -> int:
        if self.request.retries < 1:
            raise self.retry(countdown=0.3)
        return self.request.retries

    @app.task(bind=True, shared=False, name="compat.slow_pass")
    def slow_pass(self: Any, text: str, seconds: float) -> str:
        record("start", self.request.id)
        time.sleep(seconds)
        return text

    @app.task(bind=True, shared=False, name="compat.routed")
    def routed(self: Any, seconds: float) -> str:
        """Records how its message was routed, and a custom header, on every start."""
        from aaa_celery.testing import Ledger

        info = self.request.delivery_info or {}
        headers = self.request.headers if isinstance(self.request.headers, dict) else {}
        ledger = Ledger(broker)
        ledger.record("start", task_id=self.request.id,
                      delivery={k: info.get(k) for k in ("exchange", "routing_key", "priority")},
                      custom=getattr(self.request, "x_custom", None) or headers.get("x_custom"))
        ledger.close()
        time.sleep(seconds)
        return "routed"

    @app.task(bind=True, shared=False, name="compat.exhausted")
    def exhausted(self: Any) -> None:
        record("start", self.request.id)
        raise self.retry(exc=ValueError("gave up"), countdown=0.2, max_retries=1)

    @app.task(bind=True, shared=False, name="compat.eta_retry")
    def eta_retry(self: Any) -> int:
        import datetime as _dt

        record("start", self.request.id)
        if self.request.retries < 1:
            raise self.retry(eta=_dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=2))
        return self.request.retries

    @app.task(bind=True, shared=False, name="compat.backoff", autoretry_for=(KeyError,),
              retry_backoff=1, retry_backoff_max=4, retry_jitter=False, max_retries=2)
    def backoff(self: Any) -> int:
        record("start", self.request.id)
        if self.request.retries < 2:
            raise KeyError("not yet")
        return self.request.retries

    @app.task(bind=True, shared=False, name="compat.requeued")
    def requeued(self: Any) -> str:
        from celery.exceptions import Reject

        from aaa_celery.testing import Ledger

        record("start", self.request.id)
        seen = Ledger(broker)
        first = len(seen.entries(self.request.id, "start")) == 1
        seen.close()
        if first:
            raise Reject("once more", requeue=True)
        return "second delivery"

    @app.task(shared=False, name="compat.describe")
    def describe(refunded: dict[str, Any]) -> str:
        return f"{refunded['order_id']}:{refunded['amount']}"

    @app.task(shared=False, name="compat.handle")
    def handle() -> Any:
        return add.delay(2, 3)  # a task may return an AsyncResult: Celery stores it as a tuple

    @app.task(shared=False, name="compat.opaque")
    def opaque() -> Any:
        return object()

    return app


app = make_app(os.environ) if "AAA_COMPAT_BROKER" in os.environ else None
