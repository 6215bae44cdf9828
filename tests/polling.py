"""Polling with a deadline, for tests that wait on other processes: never
sleep-and-hope, fail naming what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["wait_for"]


def wait_for(pred: Callable[[], Any], what: str, timeout: float = 30.0, every: float = 0.02) -> Any:
    """Poll ``pred`` until it is truthy and return its value; fail naming
    ``what`` once ``timeout`` seconds have passed. A ``pred`` that raises
    ``TimeoutError`` (a worker too busy to answer a request-plane call in
    time, as P is while it works through a flood) counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = pred()
        except TimeoutError:
            value = None
            if time.monotonic() > deadline:
                raise
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
