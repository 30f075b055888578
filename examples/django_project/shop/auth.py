"""Who may see agent runs and decide their calls (``AAA_CELERY["AUTHORIZE"]``), and the tenant
of the runs a person starts (``AAA_CELERY["TENANT"]``)."""

from __future__ import annotations

import ipaddress
from typing import Any

from django.http import HttpRequest


def authorize(request: HttpRequest, run: Any, call: Any) -> bool:
    """Here, only a person on this machine. Replace it with your own check, e.g.
    ``request.user.is_staff`` to decide a call (``call`` is not None) and
    ``run.tenant == request.user.username`` to see a run (``run`` is not None)."""
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR") or "").is_loopback
    except ValueError:
        return False


def tenant(request: HttpRequest) -> str:
    """The tenant of the runs a person starts, from what the app knows of them, never from what
    the request says. Here everyone on this machine works for "acme"; replace it with your own,
    e.g. ``request.user.profile.tenant``."""
    return "acme"
