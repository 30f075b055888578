"""The guard inside Celery workers: GuardedTask, the recovery bootstep, explicit install."""

from .bootstep import RecoveryStep
from .install import attach, install
from .registering import registered_together
from .settings import check_settings
from .stores import app_store, store_url, use_store
from .task import GuardedTask

__all__ = [
    "GuardedTask",
    "RecoveryStep",
    "app_store",
    "attach",
    "check_settings",
    "install",
    "registered_together",
    "store_url",
    "use_store",
]
