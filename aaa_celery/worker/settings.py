"""Check a Celery app's settings against what the guard's guarantees need."""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ConfigError
from .stores import store_url


def check_settings(app: Any) -> None:
    """Refuse settings that break the guarantees; warn about ones that weaken them."""
    accepted = set(app.conf.accept_content or []) | {app.conf.task_serializer, app.conf.result_serializer}
    risky = sorted(c for c in accepted if c and ("pickle" in str(c) or "yaml" in str(c)))
    if risky:
        raise ConfigError(
            f"accept_content/task_serializer: {risky} is accepted, which runs code from any "
            "message; aaa_celery needs JSON: set accept_content=['json'], task_serializer='json', "
            "result_serializer='json'"
        )
    store_url(app)  # fails now, not at 3 a.m., if there is no store
    if (app.conf.worker_prefetch_multiplier or 4) > 1:
        warnings.warn(
            "worker_prefetch_multiplier > 1 with long guarded tasks lets one worker hold "
            "messages it cannot start; set worker_prefetch_multiplier=1 for long tools",
            stacklevel=3,
        )
