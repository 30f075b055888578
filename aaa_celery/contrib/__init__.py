"""Integrations with web frameworks: ``aaa_celery.contrib.flask`` and ``aaa_celery.contrib.django``.

Both hold one :class:`~aaa_celery.runtime.SyncEngine` per process and serve the
same routes: start a run, watch its events, decide its pending approvals, and
read each call's attempts from the store's audit trail.
"""
