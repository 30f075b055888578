"""A Flask app whose views drive agent runs; a person approves refunds in the browser.

Embedded (no server needed)::

    cd examples/flask_app && flask --app app run

Against a Redis fleet: set ``AAA_REDIS_URL`` and start the workers (see worker.py)::

    AAA_REDIS_URL=redis://127.0.0.1:6379/0 flask --app app run

Then open http://127.0.0.1:5000/aaa/, start "refund order A-100", and approve.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from typing import Any

from flask import Flask, Request, redirect

from aaa_celery.contrib.flask import AAACelery

aaa = AAACelery()


def authorize(request: Request, run: Any, call: Any) -> bool:
    """Who may see runs and decide calls: here, only a person on this machine.

    Replace it with your own check, e.g. ``current_user.is_staff`` to decide (``call`` is not
    None) and ``run.tenant == current_user.tenant`` to see a run (``run`` is not None).
    """
    try:
        return ipaddress.ip_address(request.remote_addr or "").is_loopback
    except ValueError:
        return False


def tenant(request: Request) -> str:
    """The tenant of the runs a person starts: the app's own knowledge of them, never what the
    request says (a request that names another tenant is refused, 403). Here everyone on this
    machine works for "acme"; replace it with your own, e.g. ``current_user.tenant``."""
    return "acme"


def create_app(**config: object) -> Flask:
    app = Flask(__name__)
    app.config.update(
        # the session (and so the CSRF token of approvals) is signed with it: keep it secret and stable
        SECRET_KEY=os.environ.get("FLASK_SECRET_KEY") or secrets.token_hex(32),
        AAA_CELERY_TOOLS="agent_tools:handler",
        AAA_CELERY_LLM="agent_tools:model",
        AAA_CELERY_AUTHORIZE=authorize,
        AAA_CELERY_TENANT=tenant,
        # None runs the tools on the embedded worker; a Celery app sends them to a fleet
        AAA_CELERY_APP="worker:app" if os.environ.get("AAA_REDIS_URL") else None,
    )
    app.config.update(config)
    aaa.init_app(app)

    @app.get("/")
    def home():  # type: ignore[no-untyped-def]
        return redirect("/aaa/")

    return app
