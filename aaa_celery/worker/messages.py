"""Malformed messages for guarded tasks never reach Celery's request handling.

Celery builds a request from a task message in the worker's *main* process, and some
malformed messages raise there (a body that is a JSON object instead of
``[args, kwargs, embed]``, a missing ``id`` header, a ``timelimit`` that is not a pair):
the exception stops the consumer, the message goes back to the queue, and it stops every
restarted worker too. :class:`MessageCheck`, a consumer bootstep, wraps the strategy
(Celery's per-task message handler) of every guarded task with :func:`check_message`.
A message that fails the check is:

* recorded as the call's failed outcome (``ToolArgsError``, no attempt taken) in the
  store and in the result backend, when its ``id`` header can be read and its tenant and
  run headers agree with it (else it may be another tenant's call: nothing is written);
* rejected without requeue (as Celery's ``InvalidTaskError``, which the consumer logs
  and rejects; the ``task_rejected`` signal fires).

A compressed message is inflated with a bound, before any of this (:mod:`.inflate`).

The worker keeps serving. The check is cheap: the body's size, its decoded shape (kombu
caches the decoded body, which Celery would decode here anyway) and the types of the
headers Celery reads in the main process. What the arguments mean is for the task (a
tool validates them against its schema, in the pool).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.exceptions import InvalidTaskError

from ..config import GuardConfig
from ..errors import InvalidId, ToolArgsError
from ..protocol import (
    MAX_CALL_ID_BYTES,
    RUN_HEADER,
    TENANT_HEADER,
    TOOL_CALL_HEADER,
    check_call,
    check_call_id,
    check_id,
    check_run_id,
    check_tenant,
)
from . import inflate
from .settle import settle_refused

log = logging.getLogger("aaa_celery.worker")

#: Largest body of a guarded task's message, in bytes (setting ``aaa_max_message_bytes``).
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
#: How each ``aaa_*`` header is checked (protocol's id rules: no control characters, a size cap).
_AAA_HEADERS: dict[str, Callable[[Any], Any]] = {
    RUN_HEADER: check_run_id,
    TENANT_HEADER: check_tenant,
    TOOL_CALL_HEADER: lambda v: check_id(v, "tool call id", MAX_CALL_ID_BYTES),
}
#: Headers Celery reads in the main process, and the types each may have (None: absent).
_TEXT_HEADERS = ("root_id", "parent_id", "group", "shadow", "argsrepr", "kwargsrepr", "eta", "expires", "lang")
#: The fields of a protocol 1 body that Celery's worker reads as headers
#: (``celery.worker.strategy.proto1_to_proto2``).
_V1_FIELDS = ("lang", "task", "id", "root_id", "parent_id", "group", "shadow", "eta", "expires", "retries",
              "timelimit", "argsrepr", "kwargsrepr")
_CHECKED = "_aaa_checked"


class Malformed(Exception):  # noqa: N818 - a reason, raised and caught here only
    """Why a message was refused; ``call_id`` is its id when one can be read."""

    def __init__(self, reason: str, call_id: str | None) -> None:
        super().__init__(reason)
        self.reason, self.call_id = reason, call_id


def _readable_id(value: Any) -> str | None:
    try:
        return check_call_id(value)
    except InvalidId:
        return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_headers(headers: Any) -> str:
    """The call id of a protocol 2 message whose headers Celery can read; raises
    :class:`Malformed` otherwise."""
    if not isinstance(headers, dict):
        raise Malformed(f"the headers are a {type(headers).__name__}, not a mapping", None)
    try:
        call_id = check_call_id(headers.get("id"))
    except InvalidId as e:
        raise Malformed(f"the 'id' header: {e}", None) from None
    for name, check in _AAA_HEADERS.items():
        try:
            if headers.get(name) is not None:
                check(headers[name])
        except InvalidId as e:
            # nothing is written under an id whose message names another (or no usable) tenant
            # or run: it may be another tenant's call (see protocol.check_call)
            raise Malformed(f"the {name!r} header: {e}", None) from None
    try:
        check_call(call_id, headers.get(TENANT_HEADER), headers.get(RUN_HEADER))
    except InvalidId as e:
        raise Malformed(str(e), None) from None
    for name in _TEXT_HEADERS:
        if headers.get(name) is not None and not isinstance(headers[name], str):
            raise Malformed(f"the {name!r} header must be a string", call_id)
    retries = headers.get("retries")
    if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool) or retries < 0):
        raise Malformed("the 'retries' header must be a non-negative integer", call_id)
    limits = headers.get("timelimit")
    if limits is not None and not (
        isinstance(limits, list | tuple) and len(limits) == 2
        and all(v is None or (_number(v) and v >= 0) for v in limits)
    ):
        raise Malformed("the 'timelimit' header must be [hard, soft] seconds (numbers or null)", call_id)
    return call_id


def check_message(message: Any, body: Any, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
    """Raise :class:`Malformed` unless ``message`` is a task message whose headers and body
    Celery can turn into a request: protocol 2 (the body, at most ``max_bytes``, decodes to
    ``[args (list), kwargs (object with string keys), embed (object or null)]``), or
    protocol 1 (``task_protocol=1``: Celery's consumer hands over the decoded JSON object
    body, which holds the task, id, args and kwargs; see :func:`check_v1`)."""
    headers = message.headers
    if isinstance(body, dict) and "task" in body and not (isinstance(headers, dict) and "task" in headers):
        check_v1(message, body, max_bytes)
        return
    if body is not None or not isinstance(headers, dict) or "task" not in headers:
        raise Malformed("a guarded task takes protocol 2 messages (the 'task' and 'id' headers and a "
                        "[args, kwargs, embed] body) or protocol 1 ones (an object body with 'task', 'id', "
                        "'args' and 'kwargs')", _readable_id(body.get("id") if isinstance(body, dict) else None))
    call_id = check_headers(headers)
    check_size(message, call_id, max_bytes)
    try:
        payload = message.payload
    except Exception as e:  # noqa: BLE001 - any decoder's error means the same: unreadable
        raise Malformed(f"the body cannot be decoded as {message.content_type!r}: {type(e).__name__}: "
                        f"{str(e)[:200]}", call_id) from None
    if not (isinstance(payload, list | tuple) and len(payload) == 3):
        kind = "an object" if isinstance(payload, dict) else type(payload).__name__
        raise Malformed(f"the body is {kind}, not [args, kwargs, embed]", call_id)
    args, kwargs, embed = payload
    check_arguments(args, kwargs, call_id)
    if embed is not None and not isinstance(embed, dict):
        raise Malformed(f"embed is {type(embed).__name__}, not an object", call_id)


def check_v1(message: Any, body: dict[str, Any], max_bytes: int) -> None:
    """A protocol 1 message, checked as Celery's worker reads it: the body's fields stand
    for the headers (the message's own headers, where the ``aaa_`` ones would be, on top)."""
    headers = message.headers if isinstance(message.headers, dict) else {}
    call_id = check_headers({**{k: body[k] for k in _V1_FIELDS if k in body}, **headers})
    check_size(message, call_id, max_bytes)
    check_arguments(body.get("args", ()), body.get("kwargs", {}), call_id)


def check_size(message: Any, call_id: str, max_bytes: int) -> None:
    size = len(message.body or b"")
    if size > max_bytes:
        raise Malformed(f"the body has {size} bytes, more than aaa_max_message_bytes={max_bytes}", call_id)


def check_arguments(args: Any, kwargs: Any, call_id: str) -> None:
    if not isinstance(args, list | tuple):
        raise Malformed(f"args is {type(args).__name__}, not a list", call_id)
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise Malformed("kwargs is not an object with string keys", call_id)


def record_failure(app: Any, task: Any, call_id: str, error: BaseException) -> bool:
    """:func:`~.settle.settle_refused`, for the consumer: a store that cannot be reached is
    logged, not raised (nothing here may stop the worker), and gives False."""
    try:
        return settle_refused(app, task, call_id, error)
    except Exception as e:  # noqa: BLE001
        log.warning("aaa: could not record the refused call %s: %r", call_id, e)
        return False


def _refuse(task: Any, problem: Malformed) -> InvalidTaskError:
    reason = f"{task.name}: malformed message: {problem.reason}"
    if problem.call_id is not None:
        record_failure(task.app, task, problem.call_id, ToolArgsError(reason))
    return InvalidTaskError(reason)


def checked(strategy: Any, task: Any, max_bytes: int) -> Any:
    """``strategy`` (a task's message handler) behind :func:`check_message`. A message that
    still makes the strategy raise while Celery builds the request is refused alike."""

    def handle(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any, **kwargs: Any) -> Any:
        try:
            check_message(message, body, max_bytes)
        except Malformed as problem:
            raise _refuse(task, problem) from None
        try:
            return strategy(message, body, ack, reject, callbacks, **kwargs)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as e:
            log.error("aaa: a %s message made Celery's request handling raise %r; refusing it", task.name, e,
                      exc_info=True)
            raise _refuse(task, Malformed(f"{type(e).__name__}: {e}", _readable_id(message.headers.get("id")))) from None

    setattr(handle, _CHECKED, True)
    return handle


def is_guarded(task: Any) -> bool:
    return isinstance(getattr(task, "guard_config", None), GuardConfig)


def max_message_bytes(app: Any) -> int:
    return int(app.conf.get("aaa_max_message_bytes") or DEFAULT_MAX_MESSAGE_BYTES)


def refuse_uninflated(app: Any, message: Any, reason: str) -> None:
    """A guarded call whose message could not be inflated (see :mod:`.inflate`) ends as a
    ``ToolArgsError``, when its headers name it readably (Celery then drops the message)."""
    headers = message.headers if isinstance(message.headers, dict) else {}
    task = app.tasks.get(headers.get("task")) if isinstance(headers.get("task"), str) else None
    if task is None or not is_guarded(task):
        return
    try:
        call_id = check_headers(headers)
    except Malformed:
        return
    _refuse(task, Malformed(reason, call_id))


def guard_strategies(consumer: Any) -> int:
    """Wrap the strategy of every guarded task of ``consumer`` (once); how many were wrapped."""
    app = consumer.app
    max_bytes = max_message_bytes(app)
    wrapped = 0
    for name, strategy in list(consumer.strategies.items()):
        task = app.tasks.get(name)
        if getattr(strategy, _CHECKED, False) or task is None or not is_guarded(task):
            continue
        consumer.strategies[name] = checked(strategy, task, max_bytes)
        wrapped += 1
    return wrapped


class MessageCheck(bootsteps.StartStopStep):
    """A consumer bootstep: after Celery (re)builds the task strategies, check every
    guarded task's messages before Celery handles them (see the module's docstring)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, consumer: Any) -> None:
        guard_strategies(consumer)
        if any(is_guarded(t) for t in list(consumer.app.tasks.values())):
            inflate.install(max_message_bytes(consumer.app))
            inflate.record_refusals(consumer, lambda message, reason: refuse_uninflated(consumer.app, message, reason))
