"""Settings of the example project: Celery under ``CELERY_*``, agent runs under ``AAA_CELERY``,
guarded ``django.tasks`` under ``TASKS``.

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

try:
    import django.tasks  # noqa: F401 - Django 6: the task API is Django's own

    _TASKS_APP: list[str] = []
except ImportError:  # before Django 6: the django-tasks backport
    _TASKS_APP = ["django_tasks"]

INSTALLED_APPS = [
    *_TASKS_APP,
    "aaa_celery.contrib.django",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
]
# A file, so that what `manage.py migrate` makes is there for runserver and the workers.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ.get("AAA_DJANGO_DB") or os.path.join(BASE_DIR, "db.sqlite3")}}

REDIS_URL = os.environ.get("AAA_REDIS_URL")

# Celery (read by proj/celery.py with namespace="CELERY")
CELERY_BROKER_URL = REDIS_URL or "redis://127.0.0.1:6379/0"
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_AAA_STORE_URL = CELERY_BROKER_URL
CELERY_TASK_DEFAULT_QUEUE = "default"  # the queue of django.tasks' @task (shop/tasks.py)

# django.tasks, run guarded on the fleet (shop/tasks.py; `manage.py migrate` makes the outbox)
TASKS = {
    "default": {
        "BACKEND": "aaa_celery.contrib.django.tasks.GuardedBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"APP": "proj.celery:app"},
    },
}

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
