"""GuardedTask: a ``celery.Task`` base that runs its body inside the guard.

Each delivery of a guarded task asks the store what to do (``begin``):

* ``Claimed``: run the body as attempt *n* with a heartbeat, then record the one
  result (``finish``); a result from a superseded attempt is fenced out.
* ``Busy``: another live worker holds the call. Re-check every ``wait_poll_s``
  for a short while (contention at the start of a call), then drop this copy
  without a result: the store, not the broker, brings the call back if the
  holder dies, so a duplicate never holds a worker slot for long.
* ``Finished``: answer with the recorded result; nothing runs.
* ``Refused``: the delivery policy forbids another attempt; the recorded
  ``OutcomeUnknown`` / ``ExecutionAbandoned`` is the result.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
import uuid
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, Reject

from ..config import (
    GuardConfig,
    RetryPolicy,
    build_config,
    parse_delivery,
    validate_overrides,
)
from ..context import ToolContext
from ..errors import (
    TOOL_ERRORS,
    StoreUnavailable,
    ToolArgsError,
    ToolError,
    ToolTimeout,
)
from ..lifecycle import (
    FENCED,
    STALE_RESULT,
    STARTED,
    Accepted,
    Busy,
    CallSpec,
    Claimed,
    Finished,
    Lease,
    Outcome,
    Refused,
)
from ..stores.base import Store
from .stores import app_store
from .watchdog import BodyTimedOut, LeaseCancelled, Watchdog

#: Message headers the engine sets; plain tasks fall back to Celery's ids.
RUN_HEADER = "aaa_run_id"
CALL_HEADER = "aaa_call_id"
TENANT_HEADER = "aaa_tenant"

#: How many ``wait_poll_s`` periods a delivery waits on a busy call before dropping its copy.
BUSY_POLLS = 4

log = logging.getLogger("aaa_celery.worker")

#: Whether this worker sends task events (``celery worker -E``); set by the worker's
#: recovery bootstep before the pool starts, so prefork children inherit it.
_task_events = False


def enable_task_events(enabled: bool) -> None:
    """Send the ``aaa.tool.*`` audit events as Celery task events too (``-E`` workers)."""
    global _task_events
    _task_events = bool(enabled)


def celery_event_type(audit_type: str) -> str:
    """The Celery event type of an audit event: ``aaa.tool.started`` -> ``task-aaa-tool-started``."""
    return "task-" + audit_type.replace(".", "-")


def error_for(outcome: Outcome) -> BaseException:
    """The exception a failed outcome raises for a Celery caller."""
    cls = TOOL_ERRORS.get(outcome.error or "")
    if cls is not None:
        return cls(outcome.message)
    return ToolError(f"{outcome.error}: {outcome.message}")


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

    _overrides: ClassVar[dict[str, Any]] = {}
    _resolved: ClassVar[GuardConfig | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overrides = validate_overrides(cls.__dict__.get("guard", cls.guard))
        delivery = parse_delivery(cls.__dict__.get("delivery", cls.delivery))
        if delivery is not None:
            overrides["delivery"] = delivery
        key = cls.__dict__.get("idempotency_key")
        if key is not None and not callable(key):
            raise ValueError("idempotency_key: must be a function of the task's arguments")
        cls._overrides = overrides
        cls._resolved = None
        if "run" in cls.__dict__ and "__header__" in cls.__dict__:
            # Celery checks a call's arguments against the function when it is sent;
            # ``ctx`` is the guard's to inject, so the check must not ask for it.
            cls.__header__ = staticmethod(_header_without_context(cls.__dict__["run"]))

    @classmethod
    def on_bound(cls, app: Any) -> None:
        # Every worker of an app with guarded tasks runs the recovery sweep.
        from .recovery import RecoveryStep

        if RecoveryStep not in app.steps["worker"]:
            app.steps["worker"].add(RecoveryStep)

    # -- configuration ----------------------------------------------------
    @property
    def guard_config(self) -> GuardConfig:
        """The app default (``aaa_guard``) with this task's overrides applied."""
        cls = type(self)
        if cls._resolved is None:
            base = self.app.conf.get("aaa_guard") or {}
            if not isinstance(base, GuardConfig):
                base = build_config(dict(base), where="aaa_guard")
            cls._resolved = base.merged(cls._overrides)
        return cls._resolved

    # -- publishing ---------------------------------------------------------
    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: str | None = None, **options: Any) -> Any:
        """Send the task, first registering the call in the store so a lost message is found."""
        conf = self.app.conf
        if conf.get("task_always_eager") or not conf.get("aaa_register_on_publish", True) or not self.guard_config.enabled:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        task_id = task_id or str(uuid.uuid4())
        spec = self.call_spec(task_id, list(args or ()), dict(kwargs or {}), options)
        app_store(self.app).register(spec)
        return super().apply_async(args, kwargs, task_id=task_id, **options)

    def call_spec(self, task_id: str, args: list[Any], kwargs: dict[str, Any], options: dict[str, Any]) -> CallSpec:
        headers = {k: v for k, v in (options.get("headers") or {}).items() if k.startswith("aaa_")}
        queue = options.get("queue") or options.get("routing_key")
        if queue is None:
            route = self.app.amqp.router.route(options, self.name, args, kwargs)
            queue = getattr(route.get("queue"), "name", None)
        request = {"task": self.name, "args": args, "kwargs": kwargs, "queue": queue, "headers": headers}
        key = self.key_for(task_id, headers, tuple(args), kwargs)
        return CallSpec(task_id, self.audit_name or self.name, key, request)

    def key_for(self, task_id: str, headers: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's idempotency key: the task's key function, else ``<run>/<call>`` for
        engine calls, else the task id. The same at publish time and in every attempt."""
        key_fn = type(self).idempotency_key
        if key_fn is not None:
            return str(key_fn(self.arguments(args, kwargs)))
        if headers.get(RUN_HEADER):
            return f"{headers[RUN_HEADER]}/{headers.get(CALL_HEADER) or task_id}"
        return task_id

    # -- running --------------------------------------------------------------
    def _signature(self) -> tuple[inspect.Signature, tuple[str, ...]]:
        """The task function's signature and its ``ToolContext`` parameters, computed once
        per task class."""
        cls = type(self)
        cached = cls.__dict__.get("_aaa_signature")
        if cached is None:
            sig = inspect.signature(self.run)
            cached = (sig, tuple(n for n, p in sig.parameters.items() if _is_context(p)))
            cls._aaa_signature = cached
        return cached  # type: ignore[no-any-return]

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name, for the idempotency key function."""
        try:
            bound = self._signature()[0].bind_partial(*args, **kwargs)
        except TypeError:
            return dict(kwargs)
        return {k: v for k, v in bound.arguments.items() if not isinstance(v, ToolContext)}

    def context_for(self, args: tuple[Any, ...], kwargs: dict[str, Any], attempt: int, key: str | None = None) -> ToolContext:
        req = self.request
        run_id = getattr(req, RUN_HEADER, None) or req.root_id or req.id
        call_id = getattr(req, CALL_HEADER, None) or req.id
        if key is None:
            key = self.key_for(req.id, _aaa_headers(req), args, kwargs)
        return ToolContext(
            engine=None,
            run_id=run_id,
            call_id=call_id,
            attempt=attempt,
            fence=attempt,
            idempotency_key=key,
            tenant=getattr(req, TENANT_HEADER, None),
            meta={"task_id": req.id, "hostname": req.hostname, "pid": os.getpid()},
        )

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        """Call the task function, injecting ``ctx`` if it declares one."""
        sig, context_params = self._signature()
        for name in context_params:
            if name not in kwargs:
                kwargs = {**kwargs, name: ctx}
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ToolArgsError(f"{self.name}: bad arguments: {e}") from None
        return self.run(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.request.called_directly:
            return self.body(args, kwargs, ToolContext(engine=None, run_id="direct", call_id="direct"))
        config = self.guard_config
        if not config.enabled:
            ctx = self.context_for(args, kwargs, 1)
            return Watchdog(None, None, config, self.timeout_s).run(lambda: self.body(args, kwargs, ctx))
        store = app_store(self.app)
        req = self.request
        queue = (req.delivery_info or {}).get("routing_key")
        call = self.call_spec(req.id, list(args), dict(kwargs), {"queue": queue, "headers": _aaa_headers(req)})
        worker = f"{req.hostname}/{os.getpid()}/{threading.get_ident()}"
        busy_until = time.monotonic() + BUSY_POLLS * config.wait_poll_s
        while True:
            try:
                decision = store.begin(call, worker, config)
            except StoreUnavailable:
                # Never run without a claim: hand the message back for a later try.
                time.sleep(min(5.0, config.wait_poll_s * 4))
                raise Reject("aaa store unavailable at begin", requeue=True) from None
            if isinstance(decision, Claimed):
                self._emit(STARTED, decision.lease.attempt, worker=worker)
                return self._attempt(store, decision.lease, config, args, kwargs, call.idempotency_key)
            if isinstance(decision, Finished):
                return self._answer(decision.result)
            if isinstance(decision, Refused):
                self._emit(decision.result.event_type, decision.result.attempt,
                           error=decision.result.error, message=decision.result.message)
                raise error_for(decision.result)
            assert isinstance(decision, Busy)
            if time.monotonic() >= busy_until:
                raise Ignore()  # a live holder has it; the store recovers it if the holder dies
            time.sleep(config.wait_poll_s)

    def _answer(self, outcome: Outcome) -> Any:
        if outcome.ok:
            return outcome.value
        raise error_for(outcome)

    def _attempt(
        self, store: Store, lease: Lease, config: GuardConfig, args: tuple[Any, ...], kwargs: dict[str, Any],
        key: str | None = None,
    ) -> Any:
        ctx = self.context_for(args, kwargs, lease.attempt, key)
        watchdog = Watchdog(store, lease, config, self.timeout_s)
        error: BaseException | None = None
        try:
            value = watchdog.run(lambda: self.body(args, kwargs, ctx))
            outcome = Outcome.success(value, lease.attempt)
        except LeaseCancelled:
            store.fenced(lease)
            self._emit(FENCED, lease.attempt, worker=lease.worker)
            raise Ignore() from None
        except BodyTimedOut:
            error = ToolTimeout(f"{self.audit_name or self.name}: timed out after {self.timeout_s} s")
            outcome = Outcome.failure("ToolTimeout", str(error), lease.attempt)
        except Exception as e:  # noqa: BLE001 - every failure is a recorded fact
            error = e
            outcome = Outcome.failure(type(e).__name__, str(e), lease.attempt)
        verdict = self._finish(store, lease, outcome, config)
        if not isinstance(verdict, Accepted):
            self._emit(STALE_RESULT, lease.attempt, worker=lease.worker)
            raise Ignore()  # a newer attempt owns the call; this result is audit only
        if _task_events:
            extra = {"error": outcome.error, "message": outcome.message} if not outcome.ok else {}
            self._emit(outcome.event_type, lease.attempt, worker=lease.worker, **extra)
        if error is not None:
            raise error
        return outcome.value

    def _emit(self, audit_type: str, attempt: int | None, **fields: Any) -> None:
        """Send an audit event as a Celery task event, on ``-E`` workers only (never raises:
        the store's audit trail is the record, this is for monitors such as Flower)."""
        if not _task_events:
            return
        try:
            self.send_event(celery_event_type(audit_type), retry=False, aaa_type=audit_type,
                            tool=self.audit_name or self.name, attempt=attempt, **fields)
        except Exception as e:  # noqa: BLE001
            log.warning("aaa: could not send the %s task event: %s", audit_type, e)

    def _finish(self, store: Store, lease: Lease, outcome: Outcome, config: GuardConfig) -> Any:
        delays = type(self).result_retry.delays()
        while True:
            try:
                return store.finish(lease, outcome, config)
            except StoreUnavailable:
                if not delays:
                    raise Reject("aaa store unavailable at finish", requeue=True) from None
                time.sleep(delays.pop(0))


def _is_context(p: inspect.Parameter) -> bool:
    return p.annotation in (ToolContext, "ToolContext")


def _header_without_context(run: Any) -> Any:
    fn = run.__func__ if isinstance(run, staticmethod) else run
    sig = inspect.signature(fn)
    sig = sig.replace(parameters=[p for p in sig.parameters.values() if not _is_context(p)])

    def check_arguments(*args: Any, **kwargs: Any) -> None:
        sig.bind(*args, **kwargs)

    return check_arguments


def _aaa_headers(req: Any) -> dict[str, Any]:
    return {h: getattr(req, h) for h in (RUN_HEADER, CALL_HEADER, TENANT_HEADER) if getattr(req, h, None)}
