"""A guarded task class's own options, validated when the class is made, and what is
computed once per task class.

``aaa_guard`` (the app-wide default, a dict or ``GuardConfig``) and the task's
``guard``/``delivery`` options are merged once per task class and app.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..config import GuardConfig, RetryPolicy, build_config, parse_delivery, validate_overrides
from ..errors import ConfigError
from ..policy import Concurrency
from . import calls
from .setting_names import spelled


@dataclass(frozen=True)
class TaskOptions:
    """What a task class says about its guard: config overrides and its key function."""

    overrides: dict[str, Any]
    idempotency_key: Any = None
    #: The task's concurrency rule (``concurrency=``, or ``unique=True``), or None.
    concurrency: Concurrency | None = None

    @classmethod
    def of(cls, attrs: Mapping[str, Any], inherited: Any) -> TaskOptions:
        """Validate a class's options (its own attributes, else ``inherited``'s)."""
        overrides = validate_overrides(attrs.get("guard", inherited.guard))
        delivery = parse_delivery(attrs.get("delivery", inherited.delivery))
        if delivery is not None:
            overrides["delivery"] = delivery
        key = attrs.get("idempotency_key")
        if key is not None and not callable(key):
            raise ConfigError("idempotency_key: must be a function of the task's arguments")
        return cls(overrides, key, concurrency_of(attrs.get("concurrency", inherited.concurrency),
                                                  attrs.get("unique", inherited.unique)))

    def config(self, app: Any) -> GuardConfig:
        """The app's default (``aaa_guard``) with these overrides applied."""
        base = app.conf.get("aaa_guard") or {}
        if not isinstance(base, GuardConfig):
            base = build_config(dict(base), where=spelled(app, "aaa_guard"))
        return base.merged(self.overrides)


def concurrency_of(rule: Any, unique: Any) -> Concurrency | None:
    """A task's concurrency rule from its options: ``concurrency=Concurrency(...)`` (or its
    fields as a dict), or ``unique=True``, sugar for ``Concurrency(limit=1, on_busy="skip")``:
    a call (a beat tick) finding one running is skipped, with its recorded outcome."""
    if not isinstance(unique, bool):
        raise ConfigError(f"unique: must be True or False, not {unique!r}")
    if unique and rule is not None:
        raise ConfigError("unique=True is Concurrency(limit=1, on_busy='skip'): set unique or concurrency, not both")
    if unique:
        return Concurrency(limit=1, on_busy="skip", name="unique")
    if rule is None or isinstance(rule, Concurrency):
        return rule
    if isinstance(rule, Mapping):
        return Concurrency(**rule)
    raise ConfigError(f"concurrency: must be aaa_celery.policy.Concurrency(key=..., limit=..., on_busy=...), "
                      f"not {rule!r}")


class GuardOptions:
    """The guard's task options and what is computed once per task class (a mixin of
    ``GuardedTask``): the merged config and the task function's signature."""

    delivery: ClassVar[str | None] = None
    idempotency_key: ClassVar[Any] = None
    guard: ClassVar[dict[str, Any] | GuardConfig | None] = None
    timeout_s: ClassVar[float | None] = None
    result_retry: ClassVar[RetryPolicy] = RetryPolicy()
    #: The call's name in the audit trail (the tool name for tools).
    audit_name: ClassVar[str | None] = None
    #: ``reconcile(arguments, ctx)``: asks the called system whether a lost at_most_once
    #: attempt's effect happened (``aaa_celery.guard.reconcile``).
    reconcile: ClassVar[Any] = None
    #: At most ``limit`` calls with one key run at once (``aaa_celery.policy.Concurrency``;
    #: its ``tools`` and ``tenants`` are unused here: the rule is the task's, per tenant).
    concurrency: ClassVar[Concurrency | dict[str, Any] | None] = None
    #: ``True``: ``concurrency=Concurrency(limit=1, on_busy="skip")``: a call that finds the
    #: task running (a beat tick) is skipped, with a recorded ``CallSkipped``.
    unique: ClassVar[bool] = False

    _options: ClassVar[TaskOptions] = TaskOptions({})
    _aaa_config: ClassVar[GuardConfig | None] = None
    _aaa_signature: ClassVar[calls.Signature | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._options = TaskOptions.of(cls.__dict__, cls)
        if cls.__dict__.get("reconcile") is not None and not callable(cls.__dict__["reconcile"]):
            raise ConfigError("reconcile: must be a function of (arguments, ctx) that returns "
                              "Happened(value), NotHappened(reason) or None")
        cls._aaa_config = None
        cls._aaa_signature = None
        if "run" in cls.__dict__ and "__header__" in cls.__dict__:
            # Celery checks a call's arguments against the function when it is sent;
            # ``ctx`` is the guard's to inject, so the check must not ask for it.
            header = calls.header_without_context(cls.__dict__["run"])
            if header is not None:
                cls.__header__ = staticmethod(header)  # type: ignore[attr-defined]

    @property
    def guard_config(self) -> GuardConfig:
        """The app default (``aaa_guard``) with this task's overrides applied."""
        cls = type(self)
        if cls._aaa_config is None:
            cls._aaa_config = cls._options.config(self.app)  # type: ignore[attr-defined]
        return cls._aaa_config

    @property
    def signature_(self) -> calls.Signature:
        """The task function's signature, computed once per task class."""
        cls = type(self)
        if cls._aaa_signature is None:
            cls._aaa_signature = calls.Signature(self.run)  # type: ignore[attr-defined]
        return cls._aaa_signature


def reconcile_step(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ctx_for: Any) -> Any:
    """The task's ``reconcile`` bound to one call (None if it has none): called with the lost
    attempt's number, it calls ``reconcile(arguments, ctx_for(attempt))``."""
    fn = type(task).reconcile
    if fn is None:
        return None
    return lambda attempt: fn(task.arguments(args, kwargs), ctx_for(attempt))
