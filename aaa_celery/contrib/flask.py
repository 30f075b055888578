"""Flask integration: agent runs driven from views, approvals decided by people.

::

    from aaa_celery.contrib.flask import AAACelery

    aaa = AAACelery()

    def create_app():
        app = Flask(__name__)
        app.config.update(
            AAA_CELERY_TOOLS="myapp.tools:handler",     # a ToolHandler (or a list of them)
            AAA_CELERY_LLM="myapp.llm:client",          # a model client, or an LLMHandler
            AAA_CELERY_APP=None,                        # None: embedded; or "proj.celery:app" for a fleet
        )
        aaa.init_app(app)
        return app

    # in a view:  aaa.runs.start("refund order A-100", tenant="acme")

Config keys (all optional but TOOLS and LLM): ``AAA_CELERY_APP``, ``AAA_CELERY_TOOLS``,
``AAA_CELERY_LLM``, ``AAA_CELERY_ALGORITHM`` (default ``ToolLoop`` over every tool),
``AAA_CELERY_AUTHORIZE`` (``authorize(request, action) -> bool``; protect ``decide``:
an approval must come from a person), ``AAA_CELERY_URL_PREFIX`` (default ``/aaa``).

Routes of the blueprint (under the prefix):

=======  ====================================  ==========================================
GET      ``/``                                 page: start a run, pending approvals, runs
GET      ``/runs``                             JSON: every run
POST     ``/runs``                             start: JSON or form ``task``, ``tenant``
GET      ``/runs/<run_id>``                    page: live events, Approve/Deny, attempts
GET      ``/runs/<run_id>/events?after=N``     JSON: status, events, pending, result
GET      ``/runs/<run_id>/attempts``           JSON: each call's audit trail from the store
GET      ``/approvals``                        JSON: every pending approval
POST     ``/runs/<run_id>/approvals/<call>``   decide: ``decision`` approve|deny, ``digest``, ``reason``
=======  ====================================  ==========================================
"""

from __future__ import annotations

import atexit
from typing import Any

from flask import Blueprint, Flask, abort, current_app, jsonify, redirect, request, url_for
from flask.typing import ResponseReturnValue

from ._web import AgentRuns, Settings, page

EXTENSION = "aaa_celery"


class AAACelery:
    """The Flask extension: one :class:`AgentRuns` (a sync engine) per app."""

    def __init__(self, app: Flask | None = None, **settings: Any) -> None:
        self._settings = settings
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, **settings: Any) -> None:
        """Read ``AAA_CELERY_*`` from ``app.config`` (keyword settings win), start the engine,
        and register the blueprint."""
        values = Settings.from_mapping(app.config, prefix="AAA_CELERY_")
        for key, value in {**self._settings, **settings}.items():
            setattr(values, key, value)
        runs = AgentRuns(values)
        app.extensions[EXTENSION] = runs
        atexit.register(runs.close)
        app.register_blueprint(blueprint, url_prefix=values.url_prefix)

    @property
    def runs(self) -> AgentRuns:
        """The current app's runs (inside an app or request context)."""
        return current_app.extensions[EXTENSION]  # type: ignore[no-any-return]

    @staticmethod
    def close(app: Flask) -> None:
        """Stop the app's engine (tests; at exit it stops on its own)."""
        runs: AgentRuns | None = app.extensions.pop(EXTENSION, None)
        if runs is not None:
            runs.close()
            atexit.unregister(runs.close)


blueprint = Blueprint("aaa_celery", __name__)


def _runs(action: str) -> AgentRuns:
    runs: AgentRuns = current_app.extensions[EXTENSION]
    if not runs.allowed(request, action):
        abort(403)
    return runs


def _base() -> str:
    return url_for("aaa_celery.index").rstrip("/")


@blueprint.get("/")
def index() -> ResponseReturnValue:
    _runs("view")
    return page("index", base=_base())


@blueprint.get("/runs")
def list_runs() -> ResponseReturnValue:
    return jsonify(runs=_runs("view").runs())


@blueprint.post("/runs")
def start_run() -> ResponseReturnValue:
    runs = _runs("start")
    body = request.get_json(silent=True) if request.is_json else request.form
    task = (body or {}).get("task")
    if not task:
        return jsonify(error="'task' is required"), 400
    handle = runs.start(str(task), (body or {}).get("tenant"))
    url = url_for("aaa_celery.show_run", run_id=handle.run_id)
    if request.is_json:
        return jsonify(run_id=handle.run_id, url=url), 201
    return redirect(url, code=303)


@blueprint.get("/runs/<run_id>")
def show_run(run_id: str) -> ResponseReturnValue:
    runs = _runs("view")
    if run_id not in runs.engine.engine.runs:
        abort(404)
    return page("run", base=_base(), run_id=run_id)


@blueprint.get("/runs/<run_id>/events")
def run_events(run_id: str) -> ResponseReturnValue:
    try:
        return jsonify(_runs("view").run(run_id, request.args.get("after", 0, type=int)))
    except KeyError:
        abort(404)


@blueprint.get("/runs/<run_id>/attempts")
def run_attempts(run_id: str) -> ResponseReturnValue:
    try:
        return jsonify(calls=_runs("view").attempts(run_id))
    except KeyError:
        abort(404)


@blueprint.get("/approvals")
def approvals() -> ResponseReturnValue:
    return jsonify(approvals=_runs("view").approvals())


@blueprint.post("/runs/<run_id>/approvals/<call_id>")
def decide(run_id: str, call_id: str) -> ResponseReturnValue:
    runs = _runs("decide")
    body = (request.get_json(silent=True) if request.is_json else request.form) or {}
    try:
        runs.decide(run_id, call_id, str(body.get("decision", "")), digest=body.get("digest"),
                    reason=str(body.get("reason") or ""))
    except KeyError as e:
        return jsonify(error=str(e.args[0] if e.args else e)), 404
    except ValueError as e:
        return jsonify(error=str(e)), 409
    if request.is_json:
        return jsonify(run_id=run_id, call_id=call_id, decision=body.get("decision"))
    return redirect(url_for("aaa_celery.show_run", run_id=run_id), code=303)


__all__ = ["AAACelery", "blueprint"]
