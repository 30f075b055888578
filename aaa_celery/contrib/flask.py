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
            AAA_CELERY_AUTHORIZE="myapp.auth:authorize", # authorize(request, run, call) -> bool
            SECRET_KEY=...,                             # the session holds the CSRF token
        )
        aaa.init_app(app)
        return app

    # in a view:  aaa.runs.start("refund order A-100", tenant=current_user.tenant)

Config keys (all optional but TOOLS, LLM and AUTHORIZE): ``AAA_CELERY_APP``, ``AAA_CELERY_TOOLS``,
``AAA_CELERY_LLM``, ``AAA_CELERY_ALGORITHM`` (default ``ToolLoop`` over every tool),
``AAA_CELERY_AUTHORIZE`` (``authorize(request, run, call) -> bool``: ``run`` is None to list or start
runs, ``call`` is the pending call being approved or denied, else None), ``AAA_CELERY_TENANT``
(``tenant(request) -> str | None``: the tenant of the runs a request starts), ``AAA_CELERY_ALLOW_ANONYMOUS``
(development only: no AUTHORIZE, anyone may approve; logs a warning), ``AAA_CELERY_APPROVAL_TTL_S``
(default 24 h), ``AAA_CELERY_URL_PREFIX`` (default ``/aaa``). Without AUTHORIZE (and without
ALLOW_ANONYMOUS) ``init_app`` raises ``ConfigError``. The app needs a ``SECRET_KEY``: the CSRF token of
the routes lives in Flask's session.

Every POST needs the session's CSRF token, in the ``X-CSRFToken`` header or the ``csrf_token`` form
field: the pages send it; an API client reads it from ``GET <prefix>/csrf`` (with the session cookie).
A cross-site form post therefore fails (403).

Routes of the blueprint (under the prefix):

=======  ====================================  ==========================================
GET      ``/``                                 page: start a run, pending approvals, runs
GET      ``/csrf``                             JSON: ``{"csrf_token": ...}`` of this session
GET      ``/static/aaa.js``, ``aaa.css``       the pages' script and stylesheet
GET      ``/runs``                             JSON: every run the request may see
POST     ``/runs``                             start: JSON or form ``task`` (``tenant``: only TENANT's)
GET      ``/runs/<run_id>``                    page: live events, Approve/Deny, attempts
GET      ``/runs/<run_id>/events?after=N``     JSON: status, events, pending, result
GET      ``/runs/<run_id>/attempts``           JSON: each call's audit trail from the store
GET      ``/approvals?limit=N&after=C``        JSON: a page of the pending approvals the request may see
                                               (``next``: the cursor of the next page; ETag, 304)
POST     ``/runs/<run_id>/approvals/<call>``   decide: ``decision`` approve|deny, ``digest`` (required),
                                               ``reason``
=======  ====================================  ==========================================

Pages are rendered by Flask's Jinja2 (autoescaped) and carry no inline script; every response has a
Content-Security-Policy with ``script-src 'self'``.
"""

from __future__ import annotations

import atexit
import hmac
import secrets
from typing import Any

from flask import (
    Blueprint,
    Flask,
    Response,
    abort,
    current_app,
    jsonify,
    redirect,
    render_template_string,
    request,
    session,
    url_for,
)
from flask.typing import ResponseReturnValue

from ..errors import ConfigError
from ..runtime import PendingApproval
from ..runtime.sync import SyncRunHandle
from ._pages import SECURITY_HEADERS, static, template
from ._web import AgentRuns, Settings, TenantRefused, body_too_large, etag

EXTENSION = "aaa_celery"
#: Where the session keeps the CSRF token of the routes.
CSRF_SESSION_KEY = "aaa_celery.csrf"
#: The form field that carries the CSRF token (a header ``X-CSRFToken`` works too).
CSRF_FIELD = "csrf_token"


class AAACelery:
    """The Flask extension: one :class:`AgentRuns` (a sync engine) per app."""

    def __init__(self, app: Flask | None = None, **settings: Any) -> None:
        self._settings = settings
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, **settings: Any) -> None:
        """Read ``AAA_CELERY_*`` from ``app.config`` (keyword settings win), start the engine,
        and register the blueprint.

        Raises:
            ConfigError: no ``AUTHORIZE`` hook (and no ``ALLOW_ANONYMOUS``), a hook of the wrong
                shape, or no ``SECRET_KEY`` (the CSRF token lives in the session).
        """
        values = Settings.from_mapping(app.config, prefix="AAA_CELERY_")
        for key, value in {**self._settings, **settings}.items():
            setattr(values, key, value)
        if not app.secret_key:
            raise ConfigError("aaa_celery: set the Flask app's SECRET_KEY: the CSRF token that protects "
                              "approvals lives in the session")
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


def csrf_token() -> str:
    """This session's CSRF token for the routes (made on first use)."""
    token = session.get(CSRF_SESSION_KEY)
    if not isinstance(token, str) or not token:
        token = secrets.token_urlsafe(32)
        session[CSRF_SESSION_KEY] = token
    return token


@blueprint.before_request
def _check_csrf() -> ResponseReturnValue | None:
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return None
    expected = session.get(CSRF_SESSION_KEY)
    given = request.headers.get("X-CSRFToken") or request.form.get(CSRF_FIELD) or ""
    if isinstance(expected, str) and expected and hmac.compare_digest(given.encode(), expected.encode()):
        return None
    return _error(403, f"CSRF token missing or wrong: send this session's token (GET {_base()}/csrf) in the "
                       f"X-CSRFToken header or the {CSRF_FIELD!r} form field")


@blueprint.after_request
def _headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _error(status: int, message: str) -> ResponseReturnValue:
    return jsonify(error=message), status


@blueprint.errorhandler(403)
@blueprint.errorhandler(404)
@blueprint.errorhandler(413)
def _http_error(e: Any) -> ResponseReturnValue:
    return _error(e.code, e.description)


def _runs() -> AgentRuns:
    return current_app.extensions[EXTENSION]  # type: ignore[no-any-return]


def _allowed(run: SyncRunHandle | None = None, call: PendingApproval | None = None) -> AgentRuns:
    runs = _runs()
    if not runs.allowed(request, run, call):
        abort(403, "AUTHORIZE(request, run, call) refused this request")
    return runs


def _run(run_id: str) -> SyncRunHandle:
    """The run, if this request may see it (404 unknown, 403 refused)."""
    try:
        handle = _runs().handle(run_id, request)
    except KeyError:
        abort(404)
    _allowed(handle)
    return handle


def _base() -> str:
    return url_for("aaa_celery.index").rstrip("/")


def _page(name: str, **values: str) -> ResponseReturnValue:
    # Jinja2 with autoescaping (Flask turns it on for template strings)
    return render_template_string(template(name), base=_base(), csrf=csrf_token(), csrf_field=CSRF_FIELD,
                                  **values)


@blueprint.get("/")
def index() -> ResponseReturnValue:
    _allowed()
    return _page("index")


@blueprint.get("/csrf")
def csrf() -> ResponseReturnValue:
    return jsonify(csrf_token=csrf_token())


@blueprint.get("/static/<name>")
def static_file(name: str) -> ResponseReturnValue:
    try:
        body, content_type = static(name)
    except KeyError:
        abort(404)
    return Response(body, content_type=content_type)


@blueprint.get("/runs")
def list_runs() -> ResponseReturnValue:
    return jsonify(runs=_allowed().runs(request))


@blueprint.post("/runs")
def start_run() -> ResponseReturnValue:
    runs = _allowed()
    too_large = body_too_large(runs.settings, request.content_length)
    if too_large is not None:
        return _error(413, too_large)
    request.max_content_length = runs.settings.max_body_bytes  # a body without a length, too
    body = request.get_json(silent=True) if request.is_json else request.form
    task = (body or {}).get("task")
    if not task:
        return _error(400, "'task' is required")
    try:
        tenant = runs.tenant_for(request, (body or {}).get("tenant"))
    except TenantRefused as e:
        return _error(403, str(e))
    handle = runs.start(str(task), tenant)
    url = url_for("aaa_celery.show_run", run_id=handle.run_id)
    if request.is_json:
        return jsonify(run_id=handle.run_id, url=url), 201
    return redirect(url, code=303)


@blueprint.get("/runs/<run_id>")
def show_run(run_id: str) -> ResponseReturnValue:
    _run(run_id)
    return _page("run", run_id=run_id)


@blueprint.get("/runs/<run_id>/events")
def run_events(run_id: str) -> ResponseReturnValue:
    _run(run_id)
    return jsonify(_runs().run(run_id, request.args.get("after", 0, type=int), request))


@blueprint.get("/runs/<run_id>/attempts")
def run_attempts(run_id: str) -> ResponseReturnValue:
    _run(run_id)
    return jsonify(calls=_runs().attempts(run_id, request))


@blueprint.get("/approvals")
def approvals() -> ResponseReturnValue:
    runs = _allowed()
    try:
        page = runs.approvals_page(request, request.args.get("limit"), request.args.get("after"))
    except ValueError as e:
        return _error(400, str(e))
    response = jsonify(page)
    response.set_etag(etag(page).strip('"'))
    response.headers["Cache-Control"] = "no-cache"  # the page's polls revalidate: 304 when nothing changed
    return response.make_conditional(request)


@blueprint.post("/runs/<run_id>/approvals/<path:call_id>")
def decide(run_id: str, call_id: str) -> ResponseReturnValue:
    handle = _run(run_id)
    try:
        pending = _runs().pending(run_id, call_id, request)
    except KeyError as e:
        return _error(404, str(e.args[0] if e.args else e))
    runs = _allowed(handle, pending)
    body = (request.get_json(silent=True) if request.is_json else request.form) or {}
    try:
        runs.decide(run_id, call_id, str(body.get("decision", "")), digest=body.get("digest"),
                    reason=str(body.get("reason") or ""), request=request)
    except KeyError as e:
        return _error(404, str(e.args[0] if e.args else e))
    except ValueError as e:
        return _error(409, str(e))
    if request.is_json:
        return jsonify(run_id=run_id, call_id=call_id, decision=body.get("decision"))
    return redirect(url_for("aaa_celery.show_run", run_id=run_id), code=303)


__all__ = ["AAACelery", "blueprint", "csrf_token"]
