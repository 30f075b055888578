# The Celery app loads with Django, so shared_task and the tools use it.
from .celery import app as celery_app

__all__ = ("celery_app",)
