"""The Django project of the django-db result tests: PostgreSQL (``AAA_DR_PG``, a URL) for
Django's database, which is the guard's store too."""

import os
from urllib.parse import urlsplit

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["django_celery_results"]
_pg = urlsplit(os.environ.get("AAA_DR_PG") or "postgresql://postgres@127.0.0.1:1/postgres")
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "HOST": _pg.hostname, "PORT": _pg.port,
                         "NAME": _pg.path.lstrip("/"), "USER": _pg.username}}
