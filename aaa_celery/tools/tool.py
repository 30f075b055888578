"""``@tool`` and ``Tool``: a Python function plus its schema and guard overrides."""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any, Generic, ParamSpec, Protocol, TypedDict, TypeVar, Unpack, cast, overload

from pydantic import BaseModel, ConfigDict, create_model

from ..config import Delivery, GuardConfig, GuardPolicy, parse_delivery, validate_overrides
from ..context import ToolContext
from ..errors import ConfigError, ToolArgsError
from . import args as _args
from .args import CheckedArgs
from .secrets import secret_params, without_secrets


def _context_param(fn: Callable[..., Any], hints: dict[str, Any]) -> str | None:
    for name, param in inspect.signature(fn).parameters.items():
        if hints.get(name) is ToolContext or param.annotation in (ToolContext, "ToolContext"):
            return name
    return None


def _params(fn: Callable[..., Any], skip: str | None) -> list[inspect.Parameter]:
    return [p for name, p in inspect.signature(fn).parameters.items()
            if name != skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _args_model(fn: Callable[..., Any], name: str, skip: str | None) -> type[BaseModel]:
    hints = typing.get_type_hints(fn, include_extras=True)  # keep Annotated constraints
    fields: dict[str, Any] = {}
    for param in _params(fn, skip):
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hints.get(param.name, Any), default)
    return create_model(
        f"{name}_args", __config__=ConfigDict(extra="forbid", allow_inf_nan=False), **fields
    )


P = ParamSpec("P")
R = TypeVar("R")


class ToolOptions(TypedDict, total=False):
    """The options of ``@tool(...)`` and ``Tool(fn, ...)``, for type checkers (see :class:`Tool`)."""

    name: str | None
    description: str | None
    requires_approval: bool
    timeout_s: float
    pool: str
    delivery: str | Delivery | None
    idempotency_key: Callable[[dict[str, Any]], str] | None
    guard: dict[str, Any] | GuardConfig | None
    reconcile: Callable[[dict[str, Any], ToolContext], Any] | None


class Tool(Generic[P, R]):
    """A function the model can call, run as a guarded Celery task.

    ``delivery``, ``idempotency_key`` and ``guard`` configure the guard for this
    tool; anything unset inherits the ``ToolHandler``'s default. Invalid values
    fail here, when the tool is defined.

    For type checkers a tool keeps its function's signature: ``Tool[P, R]`` has the
    function's parameters ``P`` and, awaited, its result ``R`` (an ``async def``'s too),
    so ``await refund(order_id=1)`` or ``refund.nmae`` is an error (docs/typing.md).
    """

    @overload
    def __init__(self, fn: Callable[P, Awaitable[R]], **opts: Unpack[ToolOptions]) -> None: ...

    @overload
    def __init__(self, fn: Callable[P, R], **opts: Unpack[ToolOptions]) -> None: ...

    def __init__(
        self,
        fn: Callable[P, Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        timeout_s: float = 60.0,
        pool: str = "default",
        delivery: str | Delivery | None = None,
        idempotency_key: Callable[[dict[str, Any]], str] | None = None,
        guard: dict[str, Any] | GuardConfig | None = None,
        reconcile: Callable[[dict[str, Any], ToolContext], Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"tool: expected a function, got {type(fn).__name__}")
        self.fn: Callable[P, Any] = fn
        self.name = name or fn.__name__
        self.description = description if description is not None else inspect.cleandoc(fn.__doc__ or "")
        self.requires_approval = requires_approval
        if not (isinstance(timeout_s, int | float) and timeout_s > 0):
            raise ConfigError(f"timeout_s: must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        if not isinstance(pool, str) or not pool:
            raise ConfigError(f"pool: must be a non-empty pool name, got {pool!r}")
        self.pool = pool
        self._delivery = parse_delivery(delivery)
        if idempotency_key is not None and not callable(idempotency_key):
            raise ConfigError(
                "idempotency_key: must be a function of the arguments, "
                "e.g. idempotency_key=lambda a: f\"refund:{a['order_id']}\""
            )
        self.idempotency_key = idempotency_key
        if reconcile is not None and not callable(reconcile):
            raise ConfigError("reconcile: must be a function of (arguments, ctx) that returns "
                              "Happened(value), NotHappened(reason) or None")
        #: Asks the called system whether a lost at_most_once attempt's effect happened.
        self.reconcile = reconcile
        self.guard_overrides = validate_overrides(guard)
        if self._delivery is not None:
            self.guard_overrides["delivery"] = self._delivery
        hints = typing.get_type_hints(fn)
        self.context_param = _context_param(fn, hints)
        self.args_model = _args_model(fn, self.name, self.context_param)
        #: The secret parameters (``Annotated[str, Secret]`` or ``SecretStr``), redacted wherever shown.
        self.secrets = secret_params(
            self.name, typing.get_type_hints(fn, include_extras=True),
            [p.name for p in _params(fn, self.context_param)],
        )
        self._positional = [p.name for p in inspect.signature(fn).parameters.values()
                            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    @property
    def delivery(self) -> str | None:
        """This tool's own delivery override, or None to inherit the handler's default."""
        return self._delivery.value if self._delivery is not None else None

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (``ctx`` excluded)."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return schema

    def spec(self) -> dict[str, Any]:
        """The tool as a model sees it: name, description and parameter schema."""
        return {"name": self.name, "description": self.description, "parameters": self.schema}

    def check(self, arguments: Any, policy: GuardPolicy | None = None) -> CheckedArgs:
        """Check ``arguments`` against ``policy``'s limits and the schema (see
        :mod:`aaa_celery.tools.args`); ToolArgsError names what is wrong."""
        return _args.check(self.name, self.args_model, self.secrets, arguments, policy or _args.DEFAULT_POLICY)

    def validate_args(self, arguments: Any, policy: GuardPolicy | None = None) -> dict[str, Any]:
        """The validated values of ``arguments`` (as the tool receives them); ToolArgsError
        names what is wrong."""
        return self.check(arguments, policy).values

    def shown(self, arguments: Any, policy: GuardPolicy | None = None) -> Any:
        """``arguments`` as events and pages may show them: canonical with secrets redacted;
        refused ones as a note saying why (never their values: a misspelt secret is not
        recognised as one)."""
        try:
            return self.check(arguments, policy).shown
        except ToolArgsError as e:
            return f"<refused: {e}>"

    def identity(self, arguments: Any) -> Any:
        """What identifies a call with these raw ``arguments`` in its id: the arguments
        without their secrets (:func:`~aaa_celery.tools.secrets.without_secrets`)."""
        return without_secrets(arguments, self.secrets, frozenset(self.args_model.model_fields))

    def invoke(self, arguments: dict[str, Any], ctx: ToolContext, policy: GuardPolicy | None = None) -> Any:
        """Call the function with validated arguments (a coroutine for an async tool)."""
        return self.invoke_checked(self.check(arguments, policy), ctx)

    def invoke_checked(self, checked: CheckedArgs, ctx: ToolContext) -> Any:
        """Call the function with arguments :meth:`check` passed already (a worker checks a
        delivery's arguments once, for its policy, its key and its body)."""
        kwargs = dict(checked.values)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        return cast(Callable[..., Any], self.fn)(**kwargs)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function directly, as a unit test would: unguarded (no lease, no attempt
        record), with the ``ctx`` given, else ``ToolContext.direct()``. Arguments go by name
        or position, as to the function, and are checked as a model's are. To run it
        guarded, send it: ``handler.task(name).delay(**arguments)``."""
        arguments = self._by_name(args, kwargs)
        ctx = arguments.pop(self.context_param, None) if self.context_param else None
        if ctx is not None and not isinstance(ctx, ToolContext):
            raise ToolArgsError(f"{self.name}: {self.context_param} must be a ToolContext, got {type(ctx).__name__}")
        result = self.invoke(arguments, ctx if ctx is not None else ToolContext.direct())
        return cast(R, await result if asyncio.iscoroutine(result) else result)

    def _by_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A direct call's arguments by name: positional ones bound as Python binds them."""
        if len(args) > len(self._positional):
            raise TypeError(f"{self.name}() takes {len(self._positional)} positional arguments "
                            f"but {len(args)} were given")
        arguments = dict(zip(self._positional, args))
        for name in kwargs:
            if name in arguments:
                raise TypeError(f"{self.name}() got multiple values for argument {name!r}")
        arguments.update(kwargs)
        return arguments

    def __repr__(self) -> str:
        return f"<Tool {self.name} pool={self.pool} delivery={self.delivery}>"


class ToolDecorator(Protocol):
    """What ``@tool(...)`` with options returns: the decorator that makes the ``Tool``."""

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]], /) -> Tool[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Tool[P, R]: ...


@overload
def tool(fn: Callable[P, Awaitable[R]], **opts: Unpack[ToolOptions]) -> Tool[P, R]: ...


@overload
def tool(fn: Callable[P, R], **opts: Unpack[ToolOptions]) -> Tool[P, R]: ...


@overload
def tool(fn: None = None, **opts: Unpack[ToolOptions]) -> ToolDecorator: ...


def tool(fn: Callable[..., Any] | None = None, **opts: Unpack[ToolOptions]) -> Any:
    """Decorator: ``@tool`` or ``@tool(requires_approval=True, ...)``.

    The schema comes from the type hints, the description from the docstring. Typed
    by overloads: both forms give a ``Tool[P, R]`` with the function's signature.
    """
    if fn is not None:
        return Tool(fn, **opts)
    return lambda f: Tool(f, **opts)


__all__ = ["Delivery", "Tool", "ToolDecorator", "ToolOptions", "tool"]
