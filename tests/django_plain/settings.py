"""A Django project without the aaa pages (no ``aaa_celery.contrib.django`` in
INSTALLED_APPS): Celery configured from these settings under ``namespace='CELERY'``, as
Django projects usually do. ``AAA_PLAIN_BROKER`` is the broker (also the store);
``AAA_PLAIN_UNPREFIXED=1`` adds an unprefixed ``AAA_STORE_URL`` (which Celery ignores);
``AAA_PLAIN_TYPO=1`` adds ``CELERY_AAA_STORE_ULR``; ``AAA_PLAIN_AMQP=1`` makes the broker
RabbitMQ with no store URL; ``AAA_PLAIN_EAGER=1`` runs tasks eagerly on a memory store (the
project's test settings)."""

import os

SECRET_KEY = "tests-only"
INSTALLED_APPS = ["django.contrib.contenttypes"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True

BROKER = os.environ.get("AAA_PLAIN_BROKER", "redis://127.0.0.1:1/0")
CELERY_BROKER_URL = BROKER
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if os.environ.get("AAA_PLAIN_AMQP"):
    CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:9//"
else:
    CELERY_AAA_STORE_URL = BROKER
if os.environ.get("AAA_PLAIN_UNPREFIXED"):
    AAA_STORE_URL = "redis://127.0.0.1:1/9"
if os.environ.get("AAA_PLAIN_TYPO"):
    CELERY_AAA_STORE_ULR = "redis://127.0.0.1:1/9"

ROOT_URLCONF = "tests.django_plain.urls"
if os.environ.get("AAA_PLAIN_EAGER"):  # as a project's test settings run tasks
    CELERY_TASK_ALWAYS_EAGER = True
    CELERY_AAA_STORE_URL = "memory://"
