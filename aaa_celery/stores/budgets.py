"""Budgets: amounts spent against a limit per fixed window of time, counted once per token.

The rule is planned once, by :func:`aaa_celery.lifecycle.plan_spend` (windows, the token
counted once per window, the limit); every backend applies the plan atomically (Redis in
``lua/spend.lua``, which checks the budget is as it was read). This module checks a
spend's arguments.

Used by :class:`~aaa_celery.policy.Budget` and :class:`~aaa_celery.policy.RateLimit` rules.
"""

from __future__ import annotations

import math


def check_spend(key: str, token: str, amount: float, limit: float, window_s: float) -> None:
    """Raise ``ValueError`` for arguments no budget can take."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"spend: key must be a non-empty str, not {key!r}")
    if not isinstance(token, str) or not token:
        raise ValueError(f"spend: token must be a non-empty str, not {token!r}")
    for name, value in (("amount", amount), ("limit", limit)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(f"spend: {name} must be a finite number >= 0, not {value!r}")
    if isinstance(window_s, bool) or not isinstance(window_s, int | float) or not (0 < window_s < math.inf):
        raise ValueError(f"spend: window_s must be a positive number of seconds, not {window_s!r}")
