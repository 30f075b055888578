"""Settings for ``manage.py check`` of the guarded backend, misconfigured as ``AAA_DT_CHECK`` says:
``ok``; ``faults``: acks_late and reject_on_worker_lost off, a visibility timeout below the
lease, a queue no worker serves; ``store+installed``: an unreachable store and the outbox's
app missing; ``app``: no APP; ``nostore``: no store (an AMQP broker, no ``aaa_store_url``)."""

import os

from tests.django_tasks.conformance_settings import *  # noqa: F403
from tests.django_tasks.conformance_settings import INSTALLED_APPS as _APPS

CASE = os.environ.get("AAA_DT_CHECK", "ok")
INSTALLED_APPS = [*_APPS, "tests.django_tasks.shop"]
if "installed" in CASE:
    INSTALLED_APPS = [a for a in INSTALLED_APPS if a != "aaa_celery.contrib.django"]
TASKS = {"default": {
    "BACKEND": "aaa_celery.contrib.django.tasks.GuardedBackend",
    "QUEUES": ["default", "slow"] if CASE == "faults" else ["default"],
    "OPTIONS": {} if CASE == "app" else {"APP": "tests.django_tasks.check_app:app"},
}}
