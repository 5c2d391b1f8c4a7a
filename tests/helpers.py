"""What many tests need: waiting for an event, bounded by the event itself."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    what: str,
    *,
    running: Callable[[], bool] = lambda: True,
    cap: float = 600.0,
    interval: float = 0.1,
) -> T:
    """Poll ``condition`` until it gives something true, and return that. Bound by the event, not by a time a loaded
    machine may miss: it fails at once when what would bring the event about stopped (``running()`` false) without
    it; ``cap`` only keeps the loop bounded, and says so when it is what ended the wait."""
    deadline = time.monotonic() + cap
    while time.monotonic() < deadline:
        got = condition()
        if got:
            return got
        if not running():
            pytest.fail(f"{what}: never came, and what would bring it about has ended")
        time.sleep(interval)  # the poll period
    pytest.fail(f"{what}: not after {cap:g} s, with what brings it about still running")
