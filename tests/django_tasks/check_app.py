"""The Celery app that ``check_settings`` checks (``AAA_DT_CHECK`` picks the fault)."""

import os

from celery import Celery

CASE = os.environ.get("AAA_DT_CHECK", "ok")
BROKER = os.environ.get("AAA_DT_BROKER", "redis://127.0.0.1:1/0")

app = Celery("django_tasks_check", broker="amqp://guest@127.0.0.1:1//" if CASE == "nostore" else BROKER)
app.conf.update(task_serializer="json", accept_content=["json"], task_default_queue="default",
                aaa_guard={"lease_ttl_s": 15.0})
if CASE != "nostore":  # nostore: an AMQP broker and no aaa_store_url, nowhere to keep the guard's records
    app.conf.aaa_store_url = "redis://127.0.0.1:1/0" if "store" in CASE else BROKER
if CASE == "faults":
    app.conf.task_annotations = {"*": {"acks_late": False, "reject_on_worker_lost": False}}
    app.conf.broker_transport_options = {"visibility_timeout": 5}
