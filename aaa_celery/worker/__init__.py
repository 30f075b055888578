"""The guard inside Celery workers: GuardedTask, heartbeat, recovery."""

from .install import check_settings, install
from .recovery import RecoveryStep, recover
from .stores import app_store, store_url, use_store
from .task import GuardedTask

__all__ = ["GuardedTask", "RecoveryStep", "app_store", "check_settings", "install", "recover", "store_url", "use_store"]
