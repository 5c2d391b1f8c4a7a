"""A crash finding's affected versions (``mmchaos hunt --versions``): its confirmed reproducer (``repro.py``) run on
a fresh server of each other version and configuration given, as a user following it would run it.

Each spec is a version and, after it, vLLM flags: ``0.32.0``, ``"0.30.0 --mm-processor-cache-gb 0"``. The server
gets the target's model and environment (``VLLM_SERVER_DEV_MODE`` for a reproducer with operator actions). A
reproducer whose trigger is a race (a hang-up) may survive a run without being fixed: up to ``runs`` fresh servers
are tried while it survives and says so, and the line says how many ran.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..servers.server import Server, ServerError, Target

CRASHED, SURVIVED, COULD_NOT_RUN = "crashed", "survived", "could not run"
RACE_SAID = "run it again on a fresh server"  # repro.py's words when its trigger may not have landed


@dataclass
class Affected:
    spec: str
    result: str
    runs: int
    detail: str = ""

    def line(self) -> str:
        return f"{self.spec}: {self.result}" + (f" ({self.runs} run(s))" if self.runs > 1 else "")


def parse(spec: str) -> tuple[str, list[str]]:
    """``"0.30.0 --mm-processor-cache-gb 0"`` -> ("0.30.0", ["--mm-processor-cache-gb", "0"])."""
    parts = shlex.split(spec)
    if not parts or parts[0].startswith("-"):
        raise ValueError(f"--versions {spec!r}: give a version first, then its vLLM flags")
    return parts[0], parts[1:]


def run_on(
    repro: Path,
    spec: str,
    label: str,
    target: Target,
    log_dir: Path,
    startup_timeout: float,
    runs: int = 1,
    on_start: Callable[[], None] = lambda: None,
    args: tuple[str, ...] = (),
) -> Affected:
    """``repro`` on fresh servers of ``spec`` until it crashes one, or survives without saying it raced, or
    ``runs`` servers ran it. ``label``: ``spec`` as the finding and its logs' names say it (keys masked).
    ``on_start`` is called before each server start (the hunt counts them); ``args`` go to the reproducer."""
    version, flags = parse(spec)
    result, detail = COULD_NOT_RUN, ""
    for k in range(1, runs + 1):
        on_start()
        log = log_dir / f"{re.sub(r'[^A-Za-z0-9.]+', '_', label).strip('_')}-{k}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        server = Server(Target(mode="engine", engine=version, model=target.model, flags=flags, env=target.env), log)
        try:
            server.start()
            server.wait_healthy(startup_timeout)
            p = subprocess.run(
                [sys.executable, str(repro), "--url", server.base_url, "--settle", "5", *args],
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (ServerError, subprocess.TimeoutExpired, OSError) as e:
            return Affected(label, COULD_NOT_RUN, k, str(e).splitlines()[0] if str(e) else type(e).__name__)
        finally:
            server.stop()
        result = {0: SURVIVED, 1: CRASHED}.get(p.returncode, COULD_NOT_RUN)
        detail = (p.stdout.strip().splitlines() or [""])[-1][:300]
        if result != SURVIVED or RACE_SAID not in p.stdout:
            return Affected(label, result, k, detail)
    return Affected(label, result, runs, detail)
