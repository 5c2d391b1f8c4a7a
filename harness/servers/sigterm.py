"""A supervisor's SIGTERM (Kubernetes, CI, a shell's ``kill``) stops a long-running command the way Ctrl-C does, so
its ``finally`` blocks stop the servers and processes it started instead of leaving them behind.

A KeyboardInterrupt raised while the interpreter runs a garbage collector's callback or a ``__del__`` is printed
("Exception ignored in") and lost, and the command would go on as if never asked to stop. So the handler also
remembers the request, and long loops call :func:`check` where raising is safe."""

from __future__ import annotations

import signal

_asked = False


def _interrupt(*_) -> None:
    global _asked
    _asked = True
    raise KeyboardInterrupt


def as_ctrl_c() -> None:
    """From now on, SIGTERM raises KeyboardInterrupt in the main thread."""
    signal.signal(signal.SIGTERM, _interrupt)


def check() -> None:
    """Raise KeyboardInterrupt when a SIGTERM came (its own KeyboardInterrupt may have been lost)."""
    if _asked:
        raise KeyboardInterrupt
