"""Django settings for ``overhead.py --results django-db``: django-celery-results on the
PostgreSQL store's database (``BENCH_DJANGO_DB``, a libpq URL)."""

import os
from urllib.parse import urlsplit

SECRET_KEY = "benchmarks-only"
USE_TZ = True
TIME_ZONE = "UTC"  # Django would set the process to America/Chicago, and the JSON would be dated by it
INSTALLED_APPS = ["django_celery_results"]
_pg = urlsplit(os.environ.get("BENCH_DJANGO_DB") or "postgresql://postgres@127.0.0.1:1/postgres")
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "HOST": _pg.hostname, "PORT": _pg.port,
                         "NAME": _pg.path.lstrip("/"), "USER": _pg.username}}
