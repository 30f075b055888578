"""The pages of the web integrations: two HTML templates, a script and a stylesheet (``assets/``).

The templates hold four placeholders only, ``{{ base }}``, ``{{ csrf }}``,
``{{ csrf_field }}`` and ``{{ run_id }}``, each inside a quoted attribute or as
text. Each framework renders them with its own autoescaping engine (Jinja2 in
Flask, Django's template engine), whose syntax for a plain variable is the same.
Everything else a page shows comes from the JSON endpoints through ``aaa.js``,
which sets ``textContent`` and DOM properties and never parses markup. The
script and the stylesheet are served as files, under :data:`SECURITY_HEADERS`,
whose Content-Security-Policy forbids inline script.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

#: The pages' policy: scripts, styles and fetches from this origin only; no inline script or
#: handler, no plugin, no framing, forms post back to this origin only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
#: Headers of every page, script and JSON answer of the integrations.
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}
#: The static files, by the name they are served under, with their content type.
STATIC_TYPES = {"aaa.js": "text/javascript; charset=utf-8", "aaa.css": "text/css; charset=utf-8"}
#: The templates' names.
PAGES = ("index", "run")


@cache
def asset(name: str) -> str:
    """The text of ``assets/<name>``."""
    return (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")


def template(page: str) -> str:
    """The source of a page's template (``index`` or ``run``)."""
    if page not in PAGES:
        raise KeyError(page)
    return asset(f"{page}.html")


def static(name: str) -> tuple[str, str]:
    """A static file's text and content type (``KeyError`` for any other name)."""
    content_type = STATIC_TYPES[name]  # these names only: never a path from the request
    return asset(name), content_type
