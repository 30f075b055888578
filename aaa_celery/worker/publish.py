"""The message as sent: captured at publish time, so recovery sends exactly that again.

``GuardedTask.apply_async`` publishes inside :func:`capture`; Celery's own
``before_task_publish`` signal, sent once the arguments were checked and the message
was built, hands the whole outgoing message to :func:`on_before_publish`: body (with
its canvas: callbacks, errbacks, chain, chord), headers (``eta``, ``expires``, retries,
the guard's ``aaa_`` headers, ...), properties (priority, correlation id, reply-to),
exchange, routing key and the queues to declare. The call is registered only after
the broker accepted the message, so a send that fails leaves nothing to recover.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from kombu import Exchange

from .codec import CODEC

_local = threading.local()


@contextmanager
def capture(task_name: str | None) -> Iterator[dict[str, Any]]:
    """Capture the first message this thread publishes for ``task_name`` (None: for any
    task) into the yielded dict, under ``"message"``. Captures nest: an inner one does
    not hide a message from an outer one."""
    captured: dict[str, Any] = {"task": task_name}
    stack = _local.__dict__.setdefault("pending", [])
    stack.append(captured)
    try:
        yield captured
    finally:
        stack.remove(captured)


def on_before_publish(sender: str | None = None, body: Any = None, exchange: Any = None,
                      routing_key: str | None = None, headers: dict[str, Any] | None = None,
                      properties: dict[str, Any] | None = None, declare: Any = None, **_: Any) -> None:
    """``before_task_publish`` receiver: keep the outgoing message of a guarded publish."""
    waiting = [c for c in getattr(_local, "pending", ()) if "message" not in c and c["task"] in (None, sender)]
    if not waiting:
        return
    message = CODEC.encode({
        "body": list(body) if isinstance(body, tuple) else body,
        "exchange": exchange.name if isinstance(exchange, Exchange) else exchange,
        "routing_key": routing_key,
        "headers": dict(headers or {}),
        "properties": dict(properties or {}),
        "queues": [getattr(q, "name", q) for q in declare or () if getattr(q, "name", None)],
    })
    for captured in waiting:
        captured["message"] = message


#: The message properties a publish takes again (kombu adds the others: tag, delivery info).
_KEPT_PROPERTIES = ("correlation_id", "reply_to", "priority")


def as_sent(message: dict[str, Any], exchange: str, routing_key: str, queues: list[str]) -> dict[str, Any] | None:
    """A message as a worker received it (kombu's payload: base64 JSON body, headers,
    properties) in the form :func:`on_before_publish` captures, for a call whose publish
    was never captured in the store; None for a body that is not JSON."""
    properties = message.get("properties") or {}
    body: Any = message.get("body")
    try:
        if properties.get("body_encoding") == "base64":
            body = base64.b64decode(body)
        if isinstance(body, bytes):
            body = body.decode(message.get("content-encoding") or "utf-8")
        if "json" not in str(message.get("content-type") or ""):
            return None
        body = json.loads(body) if isinstance(body, str) else body
    except (TypeError, ValueError):
        return None
    if not isinstance(body, list) or len(body) != 3:
        return None
    stored: dict[str, Any] = CODEC.encode({
        "body": body,
        "exchange": exchange,
        "routing_key": routing_key,
        "headers": dict(message.get("headers") or {}),
        "properties": {k: properties[k] for k in _KEPT_PROPERTIES if properties.get(k) is not None},
        "queues": queues,
    })
    return stored


def republish(app: Any, producer: Any, stored: dict[str, Any]) -> None:
    """Publish a captured message again, as it was sent (same id, body, headers, routing)."""
    message = CODEC.decode(stored)
    body = message["body"]
    queues = app.amqp.queues
    declare = [queues[name] for name in message.get("queues") or () if name in queues]
    producer.publish(
        tuple(body) if isinstance(body, list) else body,
        exchange=message.get("exchange") or "",
        routing_key=message.get("routing_key"),
        serializer="json",
        headers=message.get("headers") or {},
        declare=declare,
        retry=True,
        **(message.get("properties") or {}),
    )


def _when(value: Any) -> float | None:
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _field(stored: dict[str, Any], name: str) -> Any:
    """A header of a protocol 2 message; a protocol 1 message keeps it in its object body."""
    body = stored.get("body")
    return (stored.get("headers") or {}).get(name) or (body.get(name) if isinstance(body, dict) else None)


def not_before(stored: dict[str, Any]) -> float | None:
    """The message's ``eta`` (countdown) as a timestamp, if it has one."""
    return _when(_field(stored, "eta"))


def expires_at(stored: dict[str, Any]) -> float | None:
    """The message's ``expires`` as a timestamp, if it has one."""
    return _when(_field(stored, "expires"))
