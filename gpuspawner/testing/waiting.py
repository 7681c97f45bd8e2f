"""Wait on a condition with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float, interval: float = 0.1,
               message: str | Callable[[], str] = "condition") -> T:
    """Call ``condition`` until it returns a truthy value (returned), at most ``timeout``
    seconds, pausing ``interval`` seconds between calls.

    Raises:
        AssertionError: the deadline passed; the text is ``message`` (or its result).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"not met within {timeout:g} s: {text}")
        time.sleep(interval)
