"""``settings.AAA_CELERY``: read and checked (unknown keys are an ``ImproperlyConfigured``)."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from ...errors import ConfigError
from ...runtime.approvals import check_ttl
from .._web import Settings


def load_settings() -> Settings:
    """The integration's :class:`~aaa_celery.contrib._web.Settings` from ``settings.AAA_CELERY``."""
    values = getattr(django_settings, "AAA_CELERY", None) or {}
    if not isinstance(values, dict):
        raise ImproperlyConfigured("AAA_CELERY must be a dict, e.g. {'TOOLS': 'shop.tools:handler', 'LLM': ...}")
    try:
        loaded = Settings.from_mapping(values)
        check_ttl(loaded.approval_ttl_s, "AAA_CELERY['APPROVAL_TTL_S']")
    except (ValueError, ConfigError) as e:
        raise ImproperlyConfigured(str(e)) from e
    return loaded
