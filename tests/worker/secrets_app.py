"""A Celery app with secret tool arguments, for ``test_fleet_secrets.py``.

``AAA_SECRETS_BROKER`` (required) is the broker, the result backend and the store;
``AAA_SECRETS_KEY`` is ``aaa_secret_key``; ``AAA_SECRETS_GRACE`` is ``aaa_unclaimed_grace_s``.
The tools return SHA-256 digests of what they received, so the test can tell that
each secret arrived intact without the secret itself being stored as a result.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Annotated

from celery import Celery
from kombu import Queue
from pydantic import SecretStr

from aaa_celery.tools import Secret, ToolHandler, ToolRegistry, tool


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@tool
def login(user: str, password: Annotated[str, Secret], token: SecretStr) -> dict[str, str]:
    """Log in with a password and a token."""
    return {"user": user, "password": digest(password), "token": digest(token.get_secret_value())}


@tool(requires_approval=True)
def pay(amount: int, card: SecretStr) -> dict[str, str | int]:
    """Pay with a card (a person approves)."""
    return {"amount": amount, "card": digest(card.get_secret_value())}


handler = ToolHandler(ToolRegistry([login, pay]), guard={"lease_ttl_s": 2, "wait_poll_s": 0.25})


def make_app(env: Mapping[str, str]) -> Celery:
    broker = env["AAA_SECRETS_BROKER"]
    app = Celery("secrets_app", broker=broker, backend=broker)
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True, result_expires=600,
        aaa_secret_key=env["AAA_SECRETS_KEY"], aaa_recovery_interval_s=0.5,
        aaa_unclaimed_grace_s=float(env.get("AAA_SECRETS_GRACE") or 300),
        task_queues=[Queue("celery", routing_key="celery"), Queue("aaa.default", routing_key="aaa.default")],
    )
    handler.bind(app)
    return app


app = make_app(os.environ) if "AAA_SECRETS_BROKER" in os.environ else None
