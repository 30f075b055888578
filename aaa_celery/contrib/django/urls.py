"""``path("aaa/", include("aaa_celery.contrib.django.urls"))``: the routes of agent runs."""

from __future__ import annotations

from django.urls import path

from . import views

app_name = "aaa_celery"

urlpatterns = [
    path("", views.index, name="index"),
    path("runs", views.runs_view, name="runs"),
    path("runs/<str:run_id>", views.show_run, name="run"),
    path("runs/<str:run_id>/events", views.events, name="events"),
    path("runs/<str:run_id>/attempts", views.attempts, name="attempts"),
    path("runs/<str:run_id>/approvals/<str:call_id>", views.decide, name="decide"),
    path("approvals", views.approvals, name="approvals"),
]
