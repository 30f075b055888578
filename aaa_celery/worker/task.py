"""GuardedTask: a ``celery.Task`` base whose every execution runs under the guard.

A thin adapter: the rules of an attempt live in :mod:`aaa_celery.guard`. This class
maps a Celery request onto a call (its id, spec, key and ``ctx``), registers the call
when it is sent, and maps the guard's endings onto Celery's: a dropped copy is
``Ignore`` (acked, no result), a store that cannot be reached is ``Reject(requeue)``.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, cast

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult

from ..context import ToolContext
from ..errors import ForeignCall, PolicyDenied, StoreError, StoreUnavailable
from ..guard import Dropped, GuardRunner, HandBack, SlotBusy, run_unguarded, wait_s
from ..lifecycle import CallSpec, Outcome, Slot
from ..protocol import RUN_HEADER, TENANT_HEADER, WAITS_HEADER, check_call
from ..stores.base import CallStore
from . import calls, metrics, publish, registering
from .codec import result_codec, stored_arguments
from .conf import setting
from .control import REPLACED, control_for, raise_for_task
from .events import TaskEvents
from .install import attach
from .options import GuardOptions, reconcile_step
from .results import result_copy, store_accepted
from .settle import settle
from .stores import app_store, writer_store

log = logging.getLogger("aaa_celery.worker")

if TYPE_CHECKING:
    # celery-types makes Task generic over its function's parameters and result; at
    # run time celery.Task is not subscriptable. A guarded task's run() varies: Any.
    _Task = Task[..., Any]
else:
    _Task = Task


class GuardedTask(GuardOptions, _Task):
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
    #: a hard ``time_limit`` is also recorded in the store (see :mod:`aaa_celery.worker.timelimit`)
    Request = "aaa_celery.worker.timelimit:GuardedRequest"

    @classmethod
    def on_bound(cls, app: Any) -> None:
        attach(app)  # every worker of an app with guarded tasks runs the recovery sweep

    # -- publishing ---------------------------------------------------------
    def apply_async(self, args: tuple[Any, ...] | None = None, kwargs: dict[str, Any] | None = None,
                    task_id: str | None = None, *more: Any, **options: Any) -> AsyncResult[Any]:
        """Send the task as Celery does, then register the call with the message as sent, so
        recovery finds it even if the broker loses it (never for a send that failed).
        ``more``: Celery's further positional parameters (``producer``, ``link``, ...)."""
        app = self.app
        if setting(app, "task_always_eager") or not setting(app, "aaa_register_on_publish", True) \
                or not self.guard_config.enabled:
            return super().apply_async(args, kwargs, task_id, *more, **options)
        store = writer_store(app)  # an older schema is refused before anything is sent (once per process)
        with publish.capture(self.name) as sent:
            result = super().apply_async(args, kwargs, task_id, *more, **options)
        if sent.get("message") is not None:
            self._register(store, result.id, args, kwargs, sent["message"],
                           calls.aaa_headers(sent["message"]["headers"]))
        return result

    def _register(self, store: CallStore, call_id: str, args: Any, kwargs: Any, message: dict[str, Any],
                  headers: dict[str, Any]) -> None:
        """Register the call with ``message`` as sent: what recovery sends again (now, or with
        the thread's batch in :func:`~.registering.registered_together`). The message is out
        already, so a store that fails here is logged, not raised: the call runs, and its
        worker registers it at ``begin`` (only a broker that loses it goes unnoticed)."""
        spec = self.call_spec(call_id, list(args or ()), dict(kwargs or {}), message["routing_key"], headers)
        registering.register(store, calls.with_message(spec, message))

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
            return self.body(args, kwargs, ToolContext.direct())
        try:  # the call id is the key, and it says whose call this is: a header cannot say otherwise
            identity = check_call(req.id, getattr(req, TENANT_HEADER, None), getattr(req, RUN_HEADER, None))
        except ForeignCall as e:
            # acked and dropped, writing nothing: not even Celery's result (a Reject would record
            # a FAILURE under the id, which may be another tenant's running call)
            log.error("aaa: dropped message %s: %s", ascii(req.id), e)
            raise Ignore() from None
        call_id = cast(str, req.id)  # check_call raised for anything else
        config = self.guard_config
        headers = calls.aaa_headers(req)
        key = self.key_for(call_id, headers, args, kwargs)
        tool = self.audit_name or self.name
        if not config.enabled:
            ctx = calls.context(req, key, 1, tool)
            return run_unguarded(config, self.timeout_s, lambda: self.body(args, kwargs, ctx))
        queue = (req.delivery_info or {}).get("routing_key")
        call = calls.call_spec(self.name, tool, call_id, key, *stored_arguments(list(args), dict(kwargs)), queue,
                               headers)
        runner = GuardRunner(app_store(self.app), config, self.timeout_s, type(self).result_retry,
                             TaskEvents(self, tool), result_codec(config.max_result_bytes),
                             control_for(req), raise_for_task(self, call_id),
                             reconcile_step(self, args, kwargs, lambda attempt: calls.context(req, key, attempt, tool)),
                             copy_result=result_copy(self, req))
        runner.slot = self._slot(call_id, identity.tenant if identity else None, args, kwargs)
        worker = f"{req.hostname}/{os.getpid()}/{threading.get_ident()}"
        try:
            value = runner.run(call, worker, lambda attempt: self.body(args, kwargs, calls.context(req, key, attempt, tool)))
        except Dropped:
            raise Ignore() from None  # acked without a result: the call lives on in the store
        except SlotBusy as e:
            raise self._wait(runner.slot, e, args, kwargs) from None
        except HandBack as e:
            if req.is_eager:  # no broker to hand it back to: the caller sees the store trouble
                raise StoreUnavailable(f"{e.reason}; an eager call is not tried again") from None
            raise Reject(e.reason, requeue=True) from None
        if runner.copy is not None:  # the call's one result: Celery's is written without a read
            store_accepted(self, req, runner.copy)
        return value

    def concurrency_slot(self, tenant: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Slot | None:
        """The concurrency slot this call must hold to run (its ``concurrency`` or ``unique``
        option), keyed per task and tenant; raises ``PolicyDenied`` for a call whose key
        cannot be made (an argument of the key missing, the key function raising)."""
        rule = type(self)._options.concurrency
        if rule is None:
            return None
        key = rule.slot_key(self.audit_name or self.name, tenant, self.arguments(args, kwargs))
        return Slot(key, rule.limit, rule.on_busy, rule.label)

    def _slot(self, call_id: str, tenant: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Slot | None:
        """The call's slot; a call whose key cannot be made is refused: ``PolicyDenied`` is its
        outcome if no attempt has claimed it (else this copy is dropped: a copy with other
        arguments never ends a running call)."""
        try:
            return self.concurrency_slot(tenant, args, kwargs)
        except PolicyDenied as denied:
            call = CallSpec(call_id, self.audit_name or self.name)
            try:
                recorded = settle(self.app, call, Outcome.failure("PolicyDenied", str(denied)), "fenced")
            except StoreError as e:
                raise Reject(f"aaa store unavailable while refusing the call: {e}", requeue=True) from None
            if not recorded:
                raise Ignore() from None
            try:
                self.backend.mark_as_failure(call_id, denied)
            except Exception as e:  # noqa: BLE001 - the store holds the outcome; the backend is a copy
                log.warning("aaa: could not store the result of the refused call %s: %r", call_id, e)
            raise

    def _wait(self, slot: Slot | None, busy: SlotBusy, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseException:
        """Every slot of the call's key is held (``on_busy="wait"``): the message goes back to
        the broker, as Celery's ``retry`` sends it, with a countdown that backs off
        (``guard.wait_s``), so no worker process waits and the store is not polled. The call
        keeps its id; Celery's ``retries`` stays the task's own (the waits are counted in a
        header of their own), so a task's ``max_retries`` is not spent on waiting."""
        req = self.request
        if req.is_eager:  # no broker to come back through
            return PolicyDenied(f"{self.name}: {busy.reason}; an eager call does not wait",
                                rule=slot.rule if slot else None)
        waits = int(getattr(req, WAITS_HEADER, None) or 0)
        countdown = wait_s(waits, self.guard_config.lease_ttl_s)
        headers = {**(req.headers or {}), **calls.aaa_headers(req), WAITS_HEADER: waits + 1}
        sig = self.signature_from_request(req, args, kwargs, countdown=countdown, headers=headers)
        log.info("aaa: %s waits %.1f s for a slot of %s (held by %s)", req.id, countdown,
                 slot.rule if slot else "?", ", ".join(busy.holders[:3]))
        metrics.slot_wait(self)
        try:
            sig.apply_async()  # registered with its new message, as a retry is
        except Exception as e:  # noqa: BLE001 - not sent: the message itself goes back
            return Reject(f"could not send the call's wait for a slot: {e!r}", requeue=True)
        return Retry(f"waiting {countdown:.1f} s for a slot of {slot.rule if slot else '?'}", when=cast(Any, countdown), sig=sig)

    def replace(self, sig: Any) -> Any:
        """``Task.replace``: the replacement's message becomes the call's, and this attempt
        hands the call on to it (see :mod:`aaa_celery.worker.control`)."""
        with publish.capture(None) as sent:
            try:
                return super().replace(sig)
            except Ignore:
                req = self.request
                setattr(req, REPLACED, True)
                if sent.get("message") is not None and self.guard_config.enabled:
                    self._register(app_store(self.app), cast(str, req.id), req.args, req.kwargs, sent["message"],
                                   calls.aaa_headers(req))
                raise
