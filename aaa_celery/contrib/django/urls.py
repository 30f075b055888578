"""``path("aaa/", include("aaa_celery.contrib.django.urls"))``: the routes of agent runs.

Including them checks ``AAA_CELERY["AUTHORIZE"]``: without a hook (and without
``ALLOW_ANONYMOUS`` for development) the URLconf fails to load with
``ImproperlyConfigured``, so the routes never serve approvals to anyone.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.urls import path

from ...errors import ConfigError
from .._web import check_authorize
from . import views
from .settings import load_settings

try:
    check_authorize(load_settings())
except ConfigError as e:
    raise ImproperlyConfigured(str(e)) from e

app_name = "aaa_celery"

urlpatterns = [
    path("", views.index, name="index"),
    path("csrf", views.csrf, name="csrf"),
    path("static/<str:name>", views.static_file, name="static"),
    path("runs", views.runs_view, name="runs"),
    path("runs/<str:run_id>", views.show_run, name="run"),
    path("runs/<str:run_id>/events", views.events, name="events"),
    path("runs/<str:run_id>/attempts", views.attempts, name="attempts"),
    path("runs/<str:run_id>/approvals/<path:call_id>", views.decide, name="decide"),
    path("approvals", views.approvals, name="approvals"),
]
