"""MCP tool annotations and the guard's delivery policy, mapped one way and the other.

The MCP schema's ``ToolAnnotations`` are hints with cautious defaults
(``readOnlyHint=false``, ``destructiveHint=true``, ``idempotentHint=false``,
``openWorldHint=true``). The guard turns them into a delivery policy, and turns a
tool's guard config back into what the tool advertises, so the two always agree:

=========================  ===========================================================
annotations                delivery
=========================  ===========================================================
``readOnlyHint``           ``at_least_once``, no approval
``idempotentHint``         ``at_least_once``, at most ``max_attempts`` attempts (the cap)
the defaults               ``at_most_once`` (a lost attempt ends ``OutcomeUnknown``)
=========================  ===========================================================

An ``at_most_once`` tool is advertised destructive and not idempotent; an
``at_least_once`` tool is advertised idempotent (the guard may run it again). The
decision of what a lost attempt means stays in :mod:`aaa_celery.lifecycle`; this module
only picks the ``delivery`` that the guard config carries.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any

from ...config import Delivery, GuardConfig
from ...errors import ConfigError
from ...tools import Tool

__all__ = ["Hints", "advertised", "annotate", "delivery_for", "hints_of"]


@dataclass(frozen=True)
class Hints:
    """A tool's MCP annotations; unset fields hold the schema's defaults."""

    #: The tool does not modify its environment.
    read_only: bool = False
    #: It may perform destructive updates (meaningful only if not read-only).
    destructive: bool = True
    #: Calling it again with the same arguments has no additional effect.
    idempotent: bool = False
    #: It reaches an open world of external entities.
    open_world: bool = True
    #: A display name.
    title: str | None = None

    @classmethod
    def from_wire(cls, annotations: Any) -> Hints:
        """Hints from a ``ToolAnnotations`` (an SDK model or a wire dict; None: the defaults)."""
        if annotations is None:
            return cls()
        data = annotations.model_dump(by_alias=True) if hasattr(annotations, "model_dump") else dict(annotations)

        def flag(key: str, default: bool) -> bool:
            value = data.get(key)
            return default if value is None else bool(value)

        return cls(read_only=flag("readOnlyHint", False), destructive=flag("destructiveHint", True),
                   idempotent=flag("idempotentHint", False), open_world=flag("openWorldHint", True),
                   title=data.get("title"))

    def to_wire(self) -> dict[str, Any]:
        """The ``ToolAnnotations`` wire dict."""
        wire: dict[str, Any] = {"readOnlyHint": self.read_only, "destructiveHint": self.destructive,
                                "idempotentHint": self.idempotent, "openWorldHint": self.open_world}
        if self.title is not None:
            wire["title"] = self.title
        return wire


def delivery_for(hints: Hints) -> Delivery:
    """The delivery a tool with ``hints`` and no explicit delivery runs under."""
    if hints.read_only or hints.idempotent:
        return Delivery.AT_LEAST_ONCE
    return Delivery.AT_MOST_ONCE


def advertised(config: GuardConfig, hints: Hints | None = None) -> Hints:
    """What a tool run under ``config`` advertises, given the ``hints`` it declared.

    ``at_most_once``: destructive, not idempotent, not read-only, whatever was declared
    (a lost attempt is never run again, so a client must not retry it either).
    ``at_least_once``: idempotent (the guard may run it again); read-only and
    destructive as declared (not read-only and destructive by default).
    """
    declared = hints or Hints()
    if config.delivery == Delivery.AT_MOST_ONCE:
        return replace(declared, read_only=False, destructive=True, idempotent=False)
    return replace(declared, idempotent=True, destructive=declared.destructive and not declared.read_only)


_hints: weakref.WeakKeyDictionary[Tool[..., Any], Hints] = weakref.WeakKeyDictionary()


def annotate(t: Tool[..., Any], hints: Hints | None = None, **fields: Any) -> Tool[..., Any]:
    """Give ``t`` its MCP annotations (``Hints`` or its fields by name); where ``t`` has no
    explicit ``delivery``, the annotations set it (:func:`delivery_for`). Call it where the
    tool is defined, so the workers, which import the same module, run the same policy.

    Raises ConfigError for a read-only tool that requires approval (a read changes
    nothing to approve), or hints that contradict an explicit ``at_most_once``.
    """
    if not isinstance(t, Tool):
        raise ConfigError(f"annotate: {t!r} is not a Tool; decorate the function with @tool first")
    hints = replace(hints or Hints(), **fields) if fields else (hints or Hints())
    if hints.read_only and t.requires_approval:
        raise ConfigError(f"tool {t.name!r}: readOnlyHint with requires_approval=True; a read-only tool runs "
                          "at_least_once with no approval: drop one of them")
    explicit = t.guard_overrides.get("delivery")
    if explicit is None:
        t.guard_overrides["delivery"] = delivery_for(hints)
    elif Delivery(explicit) == Delivery.AT_MOST_ONCE and (hints.read_only or hints.idempotent):
        raise ConfigError(f"tool {t.name!r}: delivery='at_most_once' contradicts readOnlyHint/idempotentHint; "
                          "drop the hint, or the explicit delivery to let the hint decide it")
    _hints[t] = hints
    return t


def hints_of(t: Tool[..., Any]) -> Hints | None:
    """The hints :func:`annotate` gave ``t``, if any."""
    return _hints.get(t)
