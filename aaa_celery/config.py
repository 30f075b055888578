"""Guard configuration: the handler-wide default and each tool's overrides."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import ConfigError
from .policy import AnyRule, describe_error


class Delivery(StrEnum):
    """What a lost attempt means."""

    AT_LEAST_ONCE = "at_least_once"
    """Run a lost call again, up to ``max_attempts``. The tool may run more than once:
    make it idempotent, or pass ``ctx.idempotency_key`` to the system it calls."""

    AT_MOST_ONCE = "at_most_once"
    """Never run a call again once an attempt started. A lost attempt becomes an
    ``OutcomeUnknown`` failure for the model or a person to reconcile."""


class LostLease(StrEnum):
    """What a worker does when it discovers that it lost its lease mid-call."""

    CANCEL = "cancel"
    """Cancel the running tool and record no result (``aaa.tool.fenced``)."""

    FINISH = "finish"
    """Let the tool finish; its result is still subject to ``fence_results``."""


class GuardConfig(BaseModel):
    """The stalled-worker guard of a tool call.

    Set a default on the ``ToolHandler`` and override it per tool. Every field is
    validated when the config is built, so a bad value fails at definition time.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    enabled: bool = True
    """False: no lease and no attempt records. The broker still redelivers a request lost
    with its worker, so a call can run twice and nothing notices."""

    delivery: Delivery = Delivery.AT_LEAST_ONCE
    """``at_least_once`` re-runs a lost call; ``at_most_once`` reports ``OutcomeUnknown``."""

    max_attempts: int = Field(default=3, ge=1)
    """Cap on lost attempts (crash, stall) of one call under ``at_least_once``; past it,
    ``ExecutionAbandoned``. Retries the body asks for do not count (``max_retries`` does)."""

    lease_ttl_s: float = Field(default=15.0, gt=0)
    """Seconds a silent worker keeps its exclusive claim on a call."""

    heartbeat_s: float | None = Field(default=None, gt=0)
    """Seconds between lease renewals; default ``lease_ttl_s / 3``. Must be below the TTL."""

    wait_poll_s: float = Field(default=0.5, gt=0)
    """Seconds between re-checks by a worker that found the call busy."""

    on_lost_lease: LostLease = LostLease.CANCEL
    """``cancel`` stops the tool when its lease is lost; ``finish`` lets it complete."""

    fence_results: bool = True
    """Reject (and audit as ``aaa.tool.stale_result``) a result from a superseded attempt."""

    max_result_bytes: int | None = Field(default=1024 * 1024, gt=0)
    """Largest result a call may record, in bytes of its JSON as stored; a larger one fails
    the call with ``ResultTooLarge`` and is not recorded. None: no limit."""

    @model_validator(mode="after")
    def _heartbeat_below_ttl(self) -> GuardConfig:
        if self.heartbeat_s is not None and self.heartbeat_s >= self.lease_ttl_s:
            raise ValueError(
                f"heartbeat_s ({self.heartbeat_s}) must be smaller than lease_ttl_s "
                f"({self.lease_ttl_s}): lower heartbeat_s or raise lease_ttl_s"
            )
        return self

    @property
    def heartbeat_period_s(self) -> float:
        """The renewal period in force: ``heartbeat_s`` or ``lease_ttl_s / 3``."""
        return self.heartbeat_s if self.heartbeat_s is not None else self.lease_ttl_s / 3

    def merged(self, overrides: dict[str, Any] | GuardConfig | None) -> GuardConfig:
        """This config with a tool's explicit overrides applied (validated)."""
        if overrides is None:
            return self
        if isinstance(overrides, GuardConfig):
            overrides = overrides.model_dump(exclude_unset=True)
        return build_config({**self.model_dump(exclude_unset=True), **overrides})


def _describe(error: ValidationError, where: str) -> str:
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(config)"
        got = item.get("input")
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            known = ", ".join(GuardConfig.model_fields)
            msg = f"unknown guard option {field!r}; the options are: {known}"
            lines.append(f"{where}.{field}: {msg}")
            continue
        hint = f" (got {got!r})" if not isinstance(got, dict) else ""
        lines.append(f"{where}.{field}: {msg}{hint}")
    return "invalid guard configuration:\n  " + "\n  ".join(lines)


def build_config(data: dict[str, Any], *, where: str = "guard") -> GuardConfig:
    """Validate ``data`` as a GuardConfig, raising a ConfigError that names each field."""
    try:
        return GuardConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e, where)) from e


def validate_overrides(overrides: dict[str, Any] | GuardConfig | None) -> dict[str, Any]:
    """Check a tool's own overrides at definition time and return them as a dict.

    Each value is validated, and so is any combination within the overrides
    themselves; a conflict with the handler default is left to ``attach()``.
    """
    if overrides is None:
        return {}
    if isinstance(overrides, GuardConfig):
        return overrides.model_dump(exclude_unset=True)
    if not isinstance(overrides, dict):
        raise ConfigError(
            f"guard: expected a dict or GuardConfig, got {type(overrides).__name__}; "
            "write guard={'max_attempts': 1}, for example"
        )
    data = dict(overrides)
    probe = dict(data)
    if "heartbeat_s" in probe and "lease_ttl_s" not in probe:
        # The TTL comes later from the handler; check the heartbeat's own constraints only.
        probe["lease_ttl_s"] = float("inf")
    build_config(probe)
    return data


def parse_delivery(value: str | Delivery | None) -> Delivery | None:
    if value is None:
        return None
    try:
        return Delivery(value)
    except ValueError:
        choices = " or ".join(repr(d.value) for d in Delivery)
        raise ConfigError(
            f"delivery: {value!r} is not a delivery policy; use {choices}"
        ) from None


class RetryPolicy(BaseModel):
    """How a worker retries recording a result while the store is unreachable.

    The result is never dropped silently: when the retries run out, the message
    is handed back to the broker and the call is recovered as a lost attempt.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_tries: int = Field(default=8, ge=1)
    """How many times ``finish`` is tried before giving up."""

    initial_s: float = Field(default=0.2, gt=0)
    """Seconds before the first retry."""

    max_s: float = Field(default=5.0, gt=0)
    """Cap on the seconds between two tries."""

    multiplier: float = Field(default=2.0, ge=1)
    """Growth of the delay after each failed try."""

    def delays(self) -> list[float]:
        """The sleeps between tries, in order."""
        out, delay = [], self.initial_s
        for _ in range(self.max_tries - 1):
            out.append(min(delay, self.max_s))
            delay *= self.multiplier
        return out


class GuardPolicy(BaseModel):
    """Limits on what the model may send to tools and what comes back to it.

    Arguments are checked before a call is stored or sent, and by the worker before
    the tool runs; results after. An oversized or forbidden call becomes a
    ``ToolArgsError`` fact, never a crash. ``denied_tools``, ``default_access`` and
    ``rules`` (see :mod:`aaa_celery.policy`) are checked before a call is stored or sent,
    and again in the worker before an attempt is claimed (rate limits and budgets are
    counted there): a refused call becomes a ``PolicyDenied`` fact naming the rule, and no
    attempt is taken.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(describe_error(e, "GuardPolicy")) from None

    max_args_bytes: int = Field(default=256 * 1024, gt=0)
    """Largest size of a call's arguments, in bytes of their compact JSON as sent (kombu's:
    non-ASCII and control characters escaped, ``\u00e9`` is 6 bytes). Checked
    before the call is stored or sent (by the engine and by ``apply_async``), and again
    by the worker."""

    max_args_depth: int = Field(default=32, gt=0)
    """Deepest nesting of a call's arguments (the arguments object itself is level 1)."""

    max_string_bytes: int = Field(default=64 * 1024, gt=0)
    """Longest string anywhere in a call's arguments, in UTF-8 bytes."""

    max_result_chars: int | None = Field(default=None, gt=0)
    """Truncate a text result longer than this for the model (None: no limit)."""

    denied_tools: frozenset[str] = frozenset()
    """Tool names the model may not call, whatever the registry holds."""

    rules: tuple[Annotated[AnyRule, Field(discriminator="kind")], ...] = ()
    """Allow/Deny, Where, RateLimit and Budget rules (:mod:`aaa_celery.policy`), in order."""

    default_access: Literal["allow", "deny"] = "allow"
    """What a call that no Allow/Deny rule matches gets: ``deny`` makes the rules an allow-list."""
