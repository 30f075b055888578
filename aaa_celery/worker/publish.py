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


def not_before(stored: dict[str, Any]) -> float | None:
    """The message's ``eta`` (countdown) as a timestamp, if it has one."""
    return _when((stored.get("headers") or {}).get("eta"))


def expires_at(stored: dict[str, Any]) -> float | None:
    """The message's ``expires`` as a timestamp, if it has one."""
    return _when((stored.get("headers") or {}).get("expires"))
