"""A Flask app whose views drive agent runs; a person approves refunds in the browser.

Embedded (no server needed)::

    cd examples/flask_app && flask --app app run

Against a Redis fleet: set ``AAA_REDIS_URL`` and start the workers (see worker.py)::

    AAA_REDIS_URL=redis://127.0.0.1:6379/0 flask --app app run

Then open http://127.0.0.1:5000/aaa/, start "refund order A-100", and approve.
"""

from __future__ import annotations

import os

from flask import Flask, redirect

from aaa_celery.contrib.flask import AAACelery

aaa = AAACelery()


def create_app(**config: object) -> Flask:
    app = Flask(__name__)
    app.config.update(
        AAA_CELERY_TOOLS="agent_tools:handler",
        AAA_CELERY_LLM="agent_tools:model",
        # None runs the tools on the embedded worker; a Celery app sends them to a fleet
        AAA_CELERY_APP="worker:app" if os.environ.get("AAA_REDIS_URL") else None,
    )
    app.config.update(config)
    aaa.init_app(app)

    @app.get("/")
    def home():  # type: ignore[no-untyped-def]
        return redirect("/aaa/")

    return app
