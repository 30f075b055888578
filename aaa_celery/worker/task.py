"""GuardedTask: a ``celery.Task`` base whose every execution runs under the guard.

A thin adapter: the rules of an attempt live in :mod:`aaa_celery.guard`. This class
maps a Celery request onto a call (its id, spec, key and ``ctx``), registers the call
when it is sent, and maps the guard's endings onto Celery's: a dropped copy is
``Ignore`` (acked, no result), a store that cannot be reached is ``Reject(requeue)``.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, Reject

from ..config import GuardConfig, RetryPolicy
from ..context import ToolContext
from ..guard import Dropped, GuardRunner, HandBack, run_unguarded
from ..lifecycle import CallSpec
from . import calls, publish
from .codec import CODEC
from .events import TaskEvents
from .install import attach
from .options import TaskOptions
from .stores import app_store


class GuardedTask(Task):  # type: ignore[misc]
    """A Celery task whose every execution is leased, numbered and fenced.

    Guard options are task options, validated when the task class is made::

        @app.task(base=GuardedTask, delivery="at_most_once",
                  idempotency_key=lambda a: f"refund:{a['order_id']}",
                  guard={"lease_ttl_s": 10})
        def refund(order_id, ctx: ToolContext): ...

    The app-wide default comes from the Celery setting ``aaa_guard`` (a dict or
    ``GuardConfig``); the task's own options override it.
    """

    acks_late = True
    reject_on_worker_lost = True

    delivery: ClassVar[str | None] = None
    idempotency_key: ClassVar[Any] = None
    guard: ClassVar[dict[str, Any] | GuardConfig | None] = None
    timeout_s: ClassVar[float | None] = None
    result_retry: ClassVar[RetryPolicy] = RetryPolicy()
    #: The call's name in the audit trail (the tool name for tools).
    audit_name: ClassVar[str | None] = None

    _options: ClassVar[TaskOptions] = TaskOptions({})
    _aaa_config: ClassVar[GuardConfig | None] = None
    _aaa_signature: ClassVar[calls.Signature | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._options = TaskOptions.of(cls.__dict__, cls)
        cls._aaa_config = None
        cls._aaa_signature = None
        if "run" in cls.__dict__ and "__header__" in cls.__dict__:
            # Celery checks a call's arguments against the function when it is sent;
            # ``ctx`` is the guard's to inject, so the check must not ask for it.
            header = calls.header_without_context(cls.__dict__["run"])
            if header is not None:
                cls.__header__ = staticmethod(header)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        attach(app)  # every worker of an app with guarded tasks runs the recovery sweep

    @property
    def guard_config(self) -> GuardConfig:
        """The app default (``aaa_guard``) with this task's overrides applied."""
        cls = type(self)
        if cls._aaa_config is None:
            cls._aaa_config = cls._options.config(self.app.conf)
        return cls._aaa_config

    @property
    def signature_(self) -> calls.Signature:
        """The task function's signature, computed once per task class."""
        cls = type(self)
        if cls._aaa_signature is None:
            cls._aaa_signature = calls.Signature(self.run)
        return cls._aaa_signature

    # -- publishing ---------------------------------------------------------
    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any) -> Any:
        """Send the task as Celery does, then register the call with the message as sent, so
        recovery finds it even if the broker loses it (never for a send that failed)."""
        conf = self.app.conf
        if conf.get("task_always_eager") or not conf.get("aaa_register_on_publish", True) or not self.guard_config.enabled:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        with publish.capture(self.name) as sent:
            result = super().apply_async(args, kwargs, task_id=task_id, **options)
        message = sent.get("message")
        if message is not None:
            headers = calls.aaa_headers(message["headers"])
            spec = self.call_spec(result.id, list(args or ()), dict(kwargs or {}), message["routing_key"], headers)
            app_store(self.app).register(calls.with_message(spec, message))
        return result

    def call_spec(self, call_id: str, args: list[Any], kwargs: dict[str, Any], queue: str | None,
                  headers: dict[str, Any]) -> CallSpec:
        """The call as the store keeps it (the same at publish time and in every attempt)."""
        key = self.key_for(call_id, headers, tuple(args), kwargs)
        return calls.call_spec(self.name, self.audit_name or self.name, call_id, key, args, kwargs, queue, headers)

    def key_for(self, call_id: str, headers: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's idempotency key: the task's key function, else the default key."""
        key_fn = type(self).idempotency_key
        if key_fn is not None:
            return str(key_fn(self.arguments(args, kwargs)))
        return calls.default_key(call_id, headers)

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, for the idempotency key function."""
        return self.signature_.arguments(args, kwargs)

    # -- running --------------------------------------------------------------
    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Call the task function, injecting ``ctx`` if it declares one."""
        return self.run(*args, **self.signature_.with_context(kwargs, ctx))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        req = self.request
        if req.called_directly:
            # Unguarded: a direct call (a unit test) runs the body with a marked context.
            return self.body(args, kwargs, ToolContext(engine=None, run_id="direct", call_id="direct"))
        config = self.guard_config
        headers = calls.aaa_headers(req)
        key = self.key_for(req.id, headers, args, kwargs)
        if not config.enabled:
            ctx = calls.context(req, key, 1)
            return run_unguarded(config, self.timeout_s, lambda: self.body(args, kwargs, ctx))
        queue = (req.delivery_info or {}).get("routing_key")
        call = calls.call_spec(self.name, self.audit_name or self.name, req.id, key, list(args), dict(kwargs),
                               queue, headers)
        runner = GuardRunner(app_store(self.app), config, self.timeout_s, type(self).result_retry,
                             TaskEvents(self, self.audit_name or self.name), CODEC)
        worker = f"{req.hostname}/{os.getpid()}/{threading.get_ident()}"
        try:
            return runner.run(call, worker, lambda attempt: self.body(args, kwargs, calls.context(req, key, attempt)))
        except Dropped:
            raise Ignore() from None  # acked without a result: the call lives on in the store
        except HandBack as e:
            raise Reject(e.reason, requeue=True) from None
