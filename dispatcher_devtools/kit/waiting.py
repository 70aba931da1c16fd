"""Polling with a bound: tests never sleep a fixed time and never assert on timing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class WaitTimeout(AssertionError, TimeoutError):
    """The condition did not hold in time.  An AssertionError, so a test fails
    (not errors) at the bound; a TimeoutError, so a benchmark can treat it as one."""


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05,
               message: str = "condition") -> Any:
    """Poll until ``predicate`` is truthy and return its value; WaitTimeout at the bound."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {message}")
        time.sleep(interval)
