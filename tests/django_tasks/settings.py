"""The Django project of the django.tasks fleet tests: PostgreSQL (``AAA_DT_PG``, a URL) for
Django's database and the guard's store, Redis (``AAA_DT_BROKER``) as the broker and ledger."""

import os
from urllib.parse import urlsplit

from aaa_celery.contrib.django.tasks import _api

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = [*(["django_tasks"] if _api.SOURCE == "django_tasks" else []),
                  "aaa_celery.contrib.django", "tests.django_tasks.shop"]
AAA_CELERY = {"ALLOW_ANONYMOUS": True}
_pg = urlsplit(os.environ.get("AAA_DT_PG") or "postgresql://postgres@127.0.0.1:1/postgres")
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "HOST": _pg.hostname, "PORT": _pg.port,
                         "NAME": _pg.path.lstrip("/"), "USER": _pg.username}}
TASKS = {"default": {
    "BACKEND": "aaa_celery.contrib.django.tasks.GuardedBackend",
    "QUEUES": ["default"],
    "OPTIONS": {"APP": "tests.django_tasks.celery_app:app", "OUTBOX_GRACE_S": 3, "OUTBOX_INTERVAL_S": 1},
}}
