"""A supervisor's SIGTERM (Kubernetes, CI, a shell's ``kill``) stops a long-running command the way Ctrl-C does, so
its ``finally`` blocks stop the servers and processes it started instead of leaving them behind."""

from __future__ import annotations

import signal


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def as_ctrl_c() -> None:
    """From now on, SIGTERM raises KeyboardInterrupt in the main thread."""
    signal.signal(signal.SIGTERM, _interrupt)
