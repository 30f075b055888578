"""ToolHandler: a registry's tools as guarded Celery tasks, and their configs."""

from __future__ import annotations

import threading
from typing import Any, ClassVar, cast

from celery import Celery, Signature
from celery.result import AsyncResult
from celery.utils.saferepr import saferepr
from kombu import Queue

from ..config import GuardConfig, GuardPolicy, RetryPolicy, build_config
from ..context import ToolContext
from ..errors import ConfigError, ToolArgsError
from ..lifecycle import Slot
from ..protocol import QUEUE_PREFIX, task_name
from ..worker import GuardedTask, install
from ..worker.stores import writer_store as store_of  # the engine's: its schema checked once
from ..worker import use_store
from ..worker.calls import default_key
from . import rules
from .registry import ToolRegistry
from .args import CheckedArgs
from .secrets import require_sealer, seal, sealer_for, unseal
from .tool import Tool

__all__ = ["ToolHandler", "ToolTask", "ToolTaskHandle", "store_of", "use_store"]


#: ``.sending``: the arguments of the send in progress on this thread, as sent, with their
#: check (the call's registration at publish time asks for its key); ``.delivery``: the call
#: id, arguments and check of the delivery this thread runs (ToolTask.checked).
_memo = threading.local()


class ToolTask(GuardedTask):
    """The guarded task of one tool. Its message is ``kwargs={"arguments": {...}}``.

    ``apply_async`` checks the arguments (:mod:`aaa_celery.tools.args`) before anything
    is stored or published, sends their canonical form with secrets sealed, and shows
    them to Celery's events and logs with secrets redacted; the worker checks them again.
    """

    tool: ClassVar[Tool[..., Any]]
    policy: ClassVar[GuardPolicy] = GuardPolicy()
    engine: ClassVar[Any] = None

    def _raw(self, args: tuple[Any, ...], kwargs: dict[str, Any], clear: bool) -> Any:
        """The call's arguments with secrets unsealed; a message of another shape is refused."""
        tool = type(self).tool
        if set(kwargs) - {"arguments"} or len(args) > 1:
            raise ToolArgsError(f"{tool.name}: malformed message; expected kwargs={{'arguments': {{...}}}}")
        arguments = kwargs.get("arguments", args[0] if args else None)
        sealer = sealer_for(self.app) if tool.secrets else None  # cryptography only for secret tools
        return unseal(tool.name, {} if arguments is None else arguments, tool.secrets, sealer, clear)

    def checked(self, args: tuple[Any, ...], kwargs: dict[str, Any], clear: bool = True) -> CheckedArgs:
        """The delivery's arguments checked (:meth:`Tool.check`), once per delivery: the policy's
        rules, the idempotency key and the body each ask, and get the value the first one
        checked (kept on the request, for these very arguments; ``clear``: secrets unsealed)."""
        tool, req = type(self).tool, self.request
        clear = clear or not tool.secrets  # only a secret can arrive in clear
        if req.called_directly:  # a send's registration, or a direct call
            sent = getattr(_memo, "sending", None)
            if clear and sent is not None and sent[0] == tuple(args) and sent[1] == kwargs:
                return sent[2]  # type: ignore[no-any-return]
            return tool.check(self._raw(args, kwargs, clear), type(self).policy)
        # The same call id, arguments and policy give the same check: a memo can only be right.
        memo = getattr(_memo, "delivery", None)
        if memo is not None and memo[0] == (req.id, clear, type(self)) and memo[1] == tuple(args) \
                and memo[2] == kwargs:
            return memo[3]  # type: ignore[no-any-return]
        checked = tool.check(self._raw(args, kwargs, clear), type(self).policy)
        _memo.delivery = ((req.id, clear, type(self)), tuple(args), dict(kwargs), checked)
        return checked

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """What the idempotency key function gets: the validated, canonical arguments, with
        secrets redacted (so no key can carry one)."""
        return self.checked(args, kwargs).shown

    def key_for(self, call_id: str, headers: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        try:
            return super().key_for(call_id, headers, args, kwargs)
        except ToolArgsError:
            return default_key(call_id, headers)  # the body refuses these arguments

    def signature(self, args: Any = None, *starargs: Any, **starkwargs: Any) -> Signature[Any]:
        """Celery's signature (``s``, ``si``), with secret arguments sealed already: a signature
        travels whole inside another call's message (a chain's next step, a callback)."""
        sig = super().signature(args, *starargs, **starkwargs)
        tool, kwargs = type(self).tool, getattr(sig, "kwargs", None)
        if tool.secrets and isinstance(kwargs, dict) and isinstance(kwargs.get("arguments"), dict):
            try:
                checked = tool.check(self._raw((), {"arguments": kwargs["arguments"]}, True), type(self).policy)
            except ToolArgsError:
                return sig  # refused when it is sent
            sealer = require_sealer(self.app, tool.name, tool.secrets)
            kwargs["arguments"] = seal(checked.canonical, tool.secrets, sealer)
        return sig

    def apply_async(self, args: tuple[Any, ...] | None = None, kwargs: dict[str, Any] | None = None,
                    task_id: str | None = None, *more: Any, **options: Any) -> AsyncResult[Any]:
        """Send the call (see the class): raises ``ToolArgsError`` for arguments the tool
        refuses, before anything is stored or published."""
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        checked = type(self).tool.check(self._raw(args, kwargs, True), type(self).policy)
        return self._send(checked, args, kwargs, task_id, more, options)

    def apply_checked(self, checked: CheckedArgs, task_id: str | None = None, **options: Any) -> AsyncResult[Any]:
        """Send a call whose arguments this tool's :meth:`Tool.check` passed already, under
        this task's policy (the engine checks each call once, then carries the result)."""
        return self._send(checked, (), {}, task_id, (), options)

    def _send(self, checked: CheckedArgs, args: tuple[Any, ...], kwargs: dict[str, Any], task_id: str | None,
              more: tuple[Any, ...], options: dict[str, Any]) -> AsyncResult[Any]:
        tool = type(self).tool
        rules.judge_send(self, checked.canonical, task_id)  # the policy's rules, before anything is sent
        sent = seal(checked.canonical, tool.secrets, require_sealer(self.app, tool.name, tool.secrets)) \
            if tool.secrets else checked.canonical
        positional = "arguments" not in kwargs and bool(args)
        amqp = self.app.amqp
        if positional:
            args = (sent,)
            options["argsrepr"] = saferepr((checked.shown,), amqp.argsrepr_maxsize)
        else:
            kwargs["arguments"] = sent
            options["kwargsrepr"] = saferepr({"arguments": checked.shown}, amqp.kwargsrepr_maxsize)
        _memo.sending = (tuple(args), dict(kwargs), checked)
        try:
            return super().apply_async(args, kwargs, task_id, *more, **options)
        finally:
            _memo.sending = None

    def body(self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        tool, policy = type(self).tool, type(self).policy
        if tool.name in policy.denied_tools:
            self._raw(args, kwargs, not ctx.guarded)  # a malformed message says so first
            raise ToolArgsError(f"{tool.name}: this tool is denied by the handler's guard policy")
        checked = self.checked(args, kwargs, not ctx.guarded)
        ctx.engine = type(self).engine
        return tool.invoke_checked(checked, ctx)

    def concurrency_slot(self, tenant: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Slot | None:
        """The slot of the policy's first ``Concurrency`` rule for this tool and tenant (or the
        task's own option), keyed by the checked arguments (:func:`rules.slot_for`)."""
        return rules.slot_for(self, tenant, args, kwargs) or super().concurrency_slot(tenant, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.request.called_directly:
            rules.judge_delivery(self, args, kwargs)  # before the guard claims an attempt
        return super().__call__(*args, **kwargs)

    def run(self, arguments: dict[str, Any] | None = None) -> Any:  # pragma: no cover - body() runs tools
        raise NotImplementedError


def _add_routes(app: Celery, routes: dict[str, dict[str, str]]) -> None:
    """Route tool tasks to their pool queues, keeping the app's own routes."""
    current = app.conf.task_routes
    if current is None or isinstance(current, dict):
        app.conf.task_routes = {**(current or {}), **routes}
    else:
        app.conf.task_routes = (routes, *current)


class ToolTaskHandle:
    """A bound tool as a Celery task, sent with its arguments by name::

        handler.bind(app)
        result = handler.task("refund").delay(order_id="A-1")   # an AsyncResult
        result.get(timeout=30)

    Arguments are checked against the tool's schema before anything is published or
    stored: wrong ones raise ``ToolArgsError`` here. ``apply_async`` takes Celery's
    options (``countdown``, ``queue``, ``task_id``, ...); ``s`` makes a signature for a
    canvas. ``task`` is the Celery task itself.
    """

    def __init__(self, task: ToolTask, tool: Tool[..., Any]) -> None:
        self.task, self.tool = task, tool

    def _message(self, arguments: dict[str, Any]) -> dict[str, Any]:
        self.tool.check(arguments, type(self.task).policy)  # early, for a signature too
        return {"arguments": arguments}

    def delay(self, **arguments: Any) -> AsyncResult[Any]:
        """Send the call; returns its ``AsyncResult``."""
        return self.task.apply_async(kwargs=self._message(arguments))

    def apply_async(self, arguments: dict[str, Any] | None = None, **options: Any) -> AsyncResult[Any]:
        """Send the call with Celery's options; returns its ``AsyncResult``."""
        return self.task.apply_async(kwargs=self._message({} if arguments is None else arguments), **options)

    def s(self, **arguments: Any) -> Signature[Any]:
        """A signature of the call, for ``chain``, ``group`` and ``chord``."""
        return self.task.s(**self._message(arguments))

    def __repr__(self) -> str:
        return f"<ToolTaskHandle {self.task.name}>"


class ToolHandler:
    """Executes the tools of a registry as guarded Celery tasks.

    ``guard`` is the default for every tool; each tool's ``delivery``,
    ``idempotency_key`` and ``guard`` override it. ``result_retry`` says how a
    worker retries recording a result while the store is down. ``guards`` limits
    what the model may send to tools (``GuardPolicy``).
    """

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        pools: dict[str, int] | None = None,
        guard: GuardConfig | dict[str, Any] | None = None,
        result_retry: RetryPolicy | None = None,
        guards: GuardPolicy | None = None,
    ) -> None:
        if not isinstance(registry, ToolRegistry):
            raise ConfigError("ToolHandler: registry must be a ToolRegistry([...]) of @tool functions")
        self.registry = registry
        self.pools = dict(pools or {"default": 8})
        for pool, size in self.pools.items():
            if not isinstance(size, int) or size < 1:
                raise ConfigError(f"pools[{pool!r}]: must be a positive int of concurrent calls, got {size!r}")
        if guard is None:
            self.guard = GuardConfig()
        elif isinstance(guard, GuardConfig):
            self.guard = guard
        else:
            self.guard = build_config(dict(guard), where="ToolHandler.guard")
        self.result_retry = result_retry or RetryPolicy()
        self.guards = guards or GuardPolicy()
        self._app: Celery | None = None

    def config_for(self, t: Tool[..., Any]) -> GuardConfig:
        """Effective guard configuration of a tool: handler default + the tool's overrides."""
        try:
            return self.guard.merged(t.guard_overrides)
        except ConfigError as e:
            raise ConfigError(f"tool {t.name!r}: {e} (the handler default is {self.guard!r})") from e

    def check(self) -> None:
        """Validate every tool against the handler default (what ``attach``/``bind`` do first)."""
        for t in self.registry:
            self.config_for(t)
            if t.pool not in self.pools and t.pool != "default":
                raise ConfigError(
                    f"tool {t.name!r}: pool {t.pool!r} is not one of the handler's pools "
                    f"{sorted(self.pools)}; add it to ToolHandler(pools=...)"
                )
            rules.refuse_secret_paths(self.guards, t.name, t.secrets)

    def queue_for(self, t: Tool[..., Any], prefix: str = QUEUE_PREFIX) -> str:
        return f"{prefix}{t.pool}"

    def bind(self, app: Celery, *, queue_prefix: str = QUEUE_PREFIX, engine: Any = None) -> Celery:
        """Register every tool as a guarded task ``aaa.tool.<name>`` on ``app``.

        Each tool routes to its pool's queue ``aaa.<pool>``; those queues are added
        to the app's queues, so a plain ``celery -A proj worker`` serves every pool
        and ``-Q aaa.slow`` selects one. Refuses unsafe settings (pickle).
        """
        self.check()
        for t in self.registry:
            if t.secrets:
                require_sealer(app, t.name, t.secrets)
        install(app)
        queues = list(app.conf.task_queues or [Queue(app.conf.task_default_queue)])
        names = {q.name for q in queues}
        routes: dict[str, dict[str, str]] = {}
        for t in self.registry:
            existing = app.tasks.get(task_name(t.name)) if task_name(t.name) in app.tasks else None
            if existing is not None and getattr(type(existing), "tool", None) is not t:
                raise ConfigError(
                    f"tool {t.name!r}: another tool is already bound as {task_name(t.name)!r} on this app"
                )
            queue = self.queue_for(t, queue_prefix)
            if queue not in names:
                # Its own routing key: Celery would bind it with the default queue's key, and
                # messages for the default queue would be copied into every pool's queue.
                queues.append(Queue(queue, routing_key=queue))
                names.add(queue)
            if existing is not None:
                continue
            attrs = {
                "name": task_name(t.name),
                # a plain class attribute, as Celery's @app.task gives its task classes:
                # Task.app is a class property, resolved anew on every read
                "app": app,
                "tool": t,
                "audit_name": t.name,
                "guard": self.config_for(t),
                "timeout_s": t.timeout_s,
                "idempotency_key": t.idempotency_key,
                "reconcile": t.reconcile,
                "result_retry": self.result_retry,
                "policy": self.guards,
                "engine": engine,
                "__module__": __name__,
            }
            cls = type(f"ToolTask_{t.name}", (ToolTask,), attrs)
            app.register_task(cls())
            routes[task_name(t.name)] = {"queue": queue}
        app.conf.task_queues = queues
        _add_routes(app, routes)
        self._app = app
        return app

    def task(self, name: str) -> ToolTaskHandle:
        """The bound tool ``name`` as a Celery task handle (after :meth:`bind`)."""
        t = self.registry.get(name)
        if t is None:
            known = ", ".join(sorted(x.name for x in self.registry)) or "none"
            raise ConfigError(f"task({name!r}): no such tool in this handler; the tools are: {known}")
        if self._app is None:
            raise ConfigError(f"task({name!r}): bind the handler to a Celery app first: handler.bind(app)")
        return ToolTaskHandle(cast(ToolTask, self._app.tasks[task_name(t.name)]), t)

    def attach(self, engine: Any) -> None:
        """Attach to an ``Engine`` (or ``SyncEngine``): one tool executor per engine, later
        handlers merge their tools into the first."""
        engine.attach_tools(self)
