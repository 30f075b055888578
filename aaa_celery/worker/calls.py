"""What a guarded task knows about one call: its spec, arguments, key and context.

Computed alike at publish time (registration) and in every attempt, so the call's
idempotency key and request never differ between the two.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from celery.utils.functional import head_from_fun

from ..context import ToolContext
from ..lifecycle import CallSpec
from ..protocol import HEADERS, RUN_HEADER, TOOL_CALL_HEADER, parse_call_id


def is_context(p: inspect.Parameter) -> bool:
    """Whether a parameter asks for the guard's ``ToolContext``."""
    return p.annotation in (ToolContext, "ToolContext")


class Signature:
    """A task function's signature and its ``ToolContext`` parameters, computed once."""

    def __init__(self, fn: Any) -> None:
        self.signature = inspect.signature(fn)
        self.context_params = tuple(n for n, p in self.signature.parameters.items() if is_context(p))

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments by name (for the idempotency key function)."""
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError:
            return dict(kwargs)
        return {k: v for k, v in bound.arguments.items() if not isinstance(v, ToolContext)}

    def with_context(self, kwargs: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """``kwargs`` with ``ctx`` injected where the function asks for it. Arguments that
        do not fit raise the function's own ``TypeError``, as in plain Celery."""
        for param in self.context_params:
            if param not in kwargs:
                kwargs = {**kwargs, param: ctx}
        return kwargs


def header_without_context(run: Any) -> Any | None:
    """Celery's send-time argument check (``__header__``) for a task function that asks for
    a ``ctx`` (the guard injects it), or None if it does not. Built by Celery's own
    ``head_from_fun`` from the signature less ``ctx``, so its arity, and ``bind=True``
    (``run`` is then the plain function), are what Celery would make."""
    bound = not isinstance(run, staticmethod)
    fn = run.__func__ if isinstance(run, staticmethod) else run
    sig = inspect.signature(fn)
    kept = [p for p in sig.parameters.values() if not is_context(p)]
    if len(kept) == len(sig.parameters):
        return None

    def proxy(*args: Any, **kwargs: Any) -> None:  # pragma: no cover - only its signature is read
        return None

    proxy.__signature__ = sig.replace(parameters=kept)  # type: ignore[attr-defined]
    proxy.__name__, proxy.__module__ = fn.__name__, fn.__module__
    return head_from_fun(proxy, bound=bound)


def aaa_headers(source: Any) -> dict[str, Any]:
    """The guard's headers of a request (attributes) or of publish options (a dict)."""
    get: Callable[[str], Any] = source.get if isinstance(source, dict) else lambda h: getattr(source, h, None)
    return {h: get(h) for h in HEADERS if get(h)}


def default_key(call_id: str, headers: dict[str, Any]) -> str:
    """The idempotency key without a key function: ``<run>/<call id>`` for engine calls,
    else the call id. Never the model's tool call id: a model may reuse one for other calls."""
    if headers.get(RUN_HEADER):
        return f"{headers[RUN_HEADER]}/{call_id}"
    return call_id


def call_spec(name: str, audit_name: str, call_id: str, key: str, args: list[Any], kwargs: dict[str, Any],
              queue: str | None, headers: dict[str, Any]) -> CallSpec:
    """The spec the store keeps: enough to republish the call under the same id."""
    request = {"task": name, "args": args, "kwargs": kwargs, "queue": queue, "headers": headers}
    return CallSpec(call_id, audit_name, key, request)


def with_message(spec: CallSpec, message: dict[str, Any]) -> CallSpec:
    """The spec with the whole message as sent (in kombu's JSON), which recovery publishes
    again; the raw arguments, already in the message, are not kept a second time."""
    request = {k: v for k, v in spec.request.items() if k not in ("args", "kwargs")}
    return CallSpec(spec.call_id, spec.name, spec.idempotency_key, {**request, "message": message})


def context(request: Any, key: str, attempt: int, tool: str | None = None) -> ToolContext:
    """The ``ctx`` of an attempt of ``tool``, from the Celery request that carries it."""
    # the tenant (and, for a tenant-scoped id, the run) is the call id's: see protocol.check_call
    identity = parse_call_id(request.id)
    return ToolContext(
        engine=None,
        run_id=identity.run_id if identity else getattr(request, RUN_HEADER, None) or request.root_id or request.id,
        call_id=request.id,
        tool_call_id=getattr(request, TOOL_CALL_HEADER, None),
        attempt=attempt,
        fence=attempt,
        idempotency_key=key,
        tenant=identity.tenant if identity else None,
        tool=tool,
        meta={"task_id": request.id, "hostname": request.hostname, "pid": os.getpid()},
    )
