"""The Django app config: checks ``settings.AAA_CELERY`` at start-up."""

from __future__ import annotations

from django.apps import AppConfig


class AAACeleryConfig(AppConfig):
    """``INSTALLED_APPS += ["aaa_celery.contrib.django"]``."""

    name = "aaa_celery.contrib.django"
    label = "aaa_celery"
    verbose_name = "aaa_celery agent runs"

    def ready(self) -> None:
        from .settings import load_settings

        # fail at start-up, not on the first request; the engine itself starts lazily
        # (management commands and the celery worker never need it)
        load_settings()
