"""Budgets: amounts spent against a limit per fixed window of time, counted once per token.

The one rule every backend applies atomically (Redis mirrors it in ``lua/spend.lua``):

* time is cut in fixed windows of ``window_s`` seconds, aligned to the store's clock
  epoch (a window of 86400 s is a UTC day); a budget starts empty in every window;
* a ``token`` (the call id) is counted at most once per window: spending again with the
  same token answers True and adds nothing, so a redelivered call never spends twice;
* an amount is admitted only if the window's total plus the amount stays within the limit.

Used by :class:`~aaa_celery.policy.Budget` and :class:`~aaa_celery.policy.RateLimit` rules.
"""

from __future__ import annotations

import math

#: Slack for float sums (0.1 + 0.2 spent against a limit of 0.3 is within it).
EPSILON = 1e-9


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


def window_of(now: float, window_s: float) -> int:
    """The number of the window that ``now`` (store clock, seconds) falls in."""
    return math.floor(now / window_s)


def admits(total: float, amount: float, limit: float) -> bool:
    """Whether ``amount`` more fits in a window that has ``total`` spent."""
    return total + amount <= limit + EPSILON * max(1.0, abs(limit))
