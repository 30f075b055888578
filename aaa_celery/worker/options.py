"""A guarded task class's own options, validated when the class is made.

``aaa_guard`` (the app-wide default, a dict or ``GuardConfig``) and the task's
``guard``/``delivery`` options are merged once per task class and app.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import GuardConfig, build_config, parse_delivery, validate_overrides
from ..errors import ConfigError


@dataclass(frozen=True)
class TaskOptions:
    """What a task class says about its guard: config overrides and its key function."""

    overrides: dict[str, Any]
    idempotency_key: Any = None

    @classmethod
    def of(cls, attrs: dict[str, Any], inherited: Any) -> TaskOptions:
        """Validate a class's options (its own attributes, else ``inherited``'s)."""
        overrides = validate_overrides(attrs.get("guard", inherited.guard))
        delivery = parse_delivery(attrs.get("delivery", inherited.delivery))
        if delivery is not None:
            overrides["delivery"] = delivery
        key = attrs.get("idempotency_key")
        if key is not None and not callable(key):
            raise ConfigError("idempotency_key: must be a function of the task's arguments")
        return cls(overrides, key)

    def config(self, app_conf: Any) -> GuardConfig:
        """The app's default (``aaa_guard``) with these overrides applied."""
        base = app_conf.get("aaa_guard") or {}
        if not isinstance(base, GuardConfig):
            base = build_config(dict(base), where="aaa_guard")
        return base.merged(self.overrides)
