"""``settings.AAA_CELERY``: read and checked (unknown keys are an ``ImproperlyConfigured``)."""

from __future__ import annotations

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from .._web import Settings


def load_settings() -> Settings:
    """The integration's :class:`~aaa_celery.contrib._web.Settings` from ``settings.AAA_CELERY``."""
    values = getattr(django_settings, "AAA_CELERY", None) or {}
    if not isinstance(values, dict):
        raise ImproperlyConfigured("AAA_CELERY must be a dict, e.g. {'TOOLS': 'shop.tools:handler', 'LLM': ...}")
    try:
        return Settings.from_mapping(values)
    except ValueError as e:
        raise ImproperlyConfigured(str(e)) from e
