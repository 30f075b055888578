"""Passwords in ``aaa_*`` settings are masked wherever Celery shows an app's settings.

Celery masks the settings it knows (``broker_url``, the result backend, and any name with
KEY, SECRET, PASS ... in it) in ``app.conf.table()``, which ``celery inspect conf`` (any
client on the broker may ask a worker) and ``celery report`` print. ``aaa_store_url`` holds
a password as often as the broker's URL does, so :func:`install` (run by ``install()``/
``bind()``, by a guarded task bound to an app, and on loading the ``celery`` command's
``aaa`` plugin, which every ``celery`` command does; once per process) has that table mask every ``aaa_*`` setting too: the
password of a URL (``redis://:********@host``), and ``password=`` in a DSN's parameters,
inside lists and mappings as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from celery.app import utils as celery_utils

MASK = "*" * 8
#: ``password=...`` in a DSN's keywords or a URL's query (libpq's spellings too).
_PASSWORD_PARAM = re.compile(r"(?i)((?:^|[?&;\s])(?:password|passwd|pwd)\s*=\s*)('[^']*'|[^&;\s]*)")
_MARK = "_aaa_masks"


def masked(value: Any) -> Any:
    """``value`` with every password in it masked (a URL's, a DSN's ``password=``)."""
    if isinstance(value, str):
        # (Celery's own, which celery-types does not have; kombu's of that name masks less)
        text = celery_utils.sanitize_url(value, mask=MASK) if "://" in value else value  # type: ignore[attr-defined]
        return _PASSWORD_PARAM.sub(lambda m: m.group(1) + MASK, text)
    if isinstance(value, Mapping):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v) for v in value]
    return value


def _masking(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def filter_hidden_settings(conf: Any) -> Any:
        shown = original(conf)
        return {k: masked(v) if isinstance(k, str) and k.lower().startswith("aaa_") else v
                for k, v in shown.items()}

    setattr(filter_hidden_settings, _MARK, True)
    return filter_hidden_settings


def install() -> None:
    """Have Celery's settings filter mask the ``aaa_*`` settings too (idempotent)."""
    current = celery_utils.filter_hidden_settings
    if not getattr(current, _MARK, False):
        celery_utils.filter_hidden_settings = _masking(current)  # type: ignore[assignment]
