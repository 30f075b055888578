"""Run in a process of its own (Django is set up once per process): the project's async view
under eager test settings, through Django's AsyncClient; prints the response and what the
store recorded for the call, as JSON."""

import asyncio
import json
import os

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_plain.settings"
os.environ["AAA_PLAIN_EAGER"] = "1"

import django  # noqa: E402

django.setup()

from django.test import AsyncClient  # noqa: E402

from aaa_celery.worker.stores import app_store  # noqa: E402
from tests.django_plain.celery_app import app  # noqa: E402


async def main() -> tuple[int, dict]:
    response = await AsyncClient().get("/orders/A-1")
    return response.status_code, json.loads(response.content)


status, body = asyncio.run(main())
outcome = app_store(app).result(body["id"])
print(json.dumps({"status": status, "body": body, "recorded": outcome.value if outcome else None}))
