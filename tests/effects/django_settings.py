"""Django settings of the effects tests' shop: PostgreSQL from ``AAA_EFFECTS_PG``
(``host port dbname user``), the aaa app (its migration makes the effect tables) and the shop."""

import os

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["aaa_celery.contrib.django", "tests.effects.shop"]
AAA_CELERY = {"ALLOW_ANONYMOUS": True}
_host, _port, _name, _user = (os.environ.get("AAA_EFFECTS_PG") or "127.0.0.1 1 postgres postgres").split()
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "HOST": _host, "PORT": _port,
                         "NAME": _name, "USER": _user}}
