"""Locust's command line, built in one place: the program and its locustfile, and a worker for a master (a
campaign trial's own workers and `mmchaos worker` start them the same way)."""

from __future__ import annotations

import sys
from pathlib import Path


def locust_program(locustfile: str | Path) -> list[str]:
    """This interpreter's Locust, with the locustfile: the start of every Locust command we run."""
    return [sys.executable, "-m", "locust", "-f", str(locustfile)]


def worker_argv(master_host: str, master_port: int, locustfile: str | Path, processes: int = 0) -> list[str]:
    """Locust workers for the master at ``master_host:master_port`` (``processes``: that many, forked by Locust)."""
    argv = [*locust_program(locustfile), "--worker", "--master-host", master_host, "--master-port", str(master_port)]
    return argv + (["--processes", str(processes)] if processes else [])
