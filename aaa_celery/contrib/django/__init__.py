"""Django integration: agent runs driven from views, approvals decided by people.

In ``settings.py``::

    INSTALLED_APPS = [..., "aaa_celery.contrib.django"]
    AAA_CELERY = {
        "TOOLS": "shop.tools:handler",      # a ToolHandler (or a list of them)
        "LLM": "shop.tools:model",          # a model client, or an LLMHandler
        "APP": "proj.celery:app",           # the fleet's Celery app; None: the embedded engine
        "AUTHORIZE": "shop.auth:authorize", # authorize(request, run, call) -> bool (required)
        "TENANT": "shop.auth:tenant",       # tenant(request) -> str | None: the tenant of the runs it starts
        # "ALGORITHM": ...,                 # default: ToolLoop over every tool
        # "APPROVAL_TTL_S": 86400,          # a call waits this long for a person, then fails
        # "ALLOW_ANONYMOUS": True,          # development only, instead of AUTHORIZE (logs a warning)
    }

In ``urls.py``: ``path("aaa/", include("aaa_celery.contrib.django.urls"))`` serves
the pages and JSON endpoints (start a run, its live events, pending approvals
with Approve/Deny, each call's attempts). ``authorize(request, run, call)`` is
asked on every route: ``run`` is None to list or start runs, ``call`` is the
pending call being approved or denied (else None). Without it (and without
``ALLOW_ANONYMOUS``) including the URLs raises ``ImproperlyConfigured``. POSTs
are under Django's CSRF protection: the pages send the token; an API client
gets it from ``GET aaa/csrf``. In your own views, ``get_runs()`` is
the process's :class:`~aaa_celery.contrib._web.AgentRuns`::

    from aaa_celery.contrib.django import get_runs

    def refund(request, order_id):
        runs = get_runs()
        handle = runs.start(f"refund order {order_id}", tenant=runs.tenant_for(request))
        return JsonResponse({"run_id": handle.run_id}, status=201)

The engine starts on first use, once per process (under gunicorn: in each
worker, after the fork) and stops at exit.
"""

from __future__ import annotations

from .runs import close_runs, get_runs

__all__ = ["close_runs", "get_runs"]
