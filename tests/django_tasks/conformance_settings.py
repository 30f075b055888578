"""Settings of the conformance run: SQLite in ``AAA_DT_SQLITE``, the eager app."""

import os

try:
    import django.tasks  # noqa: F401

    _BACKPORT: list[str] = []
except ImportError:
    _BACKPORT = ["django_tasks"]

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = [*_BACKPORT, "aaa_celery.contrib.django"]
AAA_CELERY = {"ALLOW_ANONYMOUS": True}
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("AAA_DT_SQLITE", "/tmp/aaa-django-tasks-conformance.sqlite3")}}
TASKS = {"default": {
    "BACKEND": "aaa_celery.contrib.django.tasks.GuardedBackend",
    "QUEUES": ["default", "slow"],
    "OPTIONS": {"APP": "tests.django_tasks.conformance_app:app"},
}}
