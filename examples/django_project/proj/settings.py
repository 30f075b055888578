"""Settings of the example project: Celery under ``CELERY_*``, agent runs under ``AAA_CELERY``.

By default runs use the embedded engine (no server). With ``AAA_REDIS_URL`` set,
tool calls go to a Redis fleet of ``celery -A proj worker`` processes.
"""

import os

BASE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "proj.urls"
USE_TZ = True

INSTALLED_APPS = [
    "aaa_celery.contrib.django",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

REDIS_URL = os.environ.get("AAA_REDIS_URL")

# Celery (read by proj/celery.py with namespace="CELERY")
CELERY_BROKER_URL = REDIS_URL or "redis://127.0.0.1:6379/0"
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_AAA_STORE_URL = CELERY_BROKER_URL

# Agent runs
AAA_CELERY = {
    "TOOLS": "shop.tools:handler",
    "LLM": "shop.tools:model",
    "APP": "proj.celery:app" if REDIS_URL else None,
    # who may see runs and approve or deny calls: authorize(request, run, call) -> bool
    "AUTHORIZE": "shop.auth:authorize",
    # the tenant of the runs a person starts: tenant(request) -> str (never the request's say)
    "TENANT": "shop.auth:tenant",
}
