from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait(check: Callable[[], Any], timeout_s: float = 10) -> Any:
    """Poll ``check()`` until it is truthy; return its value."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value
