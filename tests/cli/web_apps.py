"""Flask apps for ``aaa doctor --flask-app``: one with an AUTHORIZE hook, one open to anyone."""

from __future__ import annotations

from flask import Flask

from aaa_celery.contrib.flask import AAACelery
from aaa_celery.llm import FakeLLMClient
from aaa_celery.tools import ToolHandler, ToolRegistry, tool


@tool
def noop() -> str:
    """Do nothing."""
    return "ok"


def _app(**config: object) -> Flask:
    app = Flask(__name__)
    app.config.update(SECRET_KEY="test", AAA_CELERY_TOOLS=ToolHandler(ToolRegistry([noop])),
                      AAA_CELERY_LLM=FakeLLMClient([]), **config)
    AAACelery().init_app(app)
    return app


def guarded() -> Flask:
    return _app(AAA_CELERY_AUTHORIZE=lambda request, run, call: False)


def anonymous() -> Flask:
    return _app(AAA_CELERY_ALLOW_ANONYMOUS=True)


def unset() -> Flask:
    return _app()
