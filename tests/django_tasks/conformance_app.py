"""The conformance run's Celery app: eager (no broker, no worker), the memory store."""

from celery import Celery

app = Celery("django_tasks_conformance", broker="memory://")
app.conf.update(task_always_eager=True, task_serializer="json", accept_content=["json"],
                task_default_queue="default", aaa_store_url="memory://")
