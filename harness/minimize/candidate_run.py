"""One candidate of the minimizer, on a fresh server: start the server the trial ran (same engine, flags, env), run
the reproducer script against it, watch the server as a campaign does, stop it, and say whether it crashed and how.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mmchaos import schema
from mmchaos.manifest import TargetDetail, TrialManifest
from mmchaos.signatures import Signatures

from ..servers import crash_watch
from ..servers.server import Server, ServerError, Target
from .repro_script import parse_result

TICK = 0.2  # seconds between observations of the server, as in a campaign
SCRIPT = "repro.py"


@dataclass
class Outcome:
    crashed: bool
    signature: str | None  # the crash's chain of signatures (root first), classified from the server log
    statuses: list  # what each request got (None: no answer), as the script saw it
    script_says: str | None  # the script's own verdict: why it thinks the server died (None: survived)
    log_lines: list[str]  # the classified server-log lines of the run
    folder: Path


def run_candidate(
    script: str,
    target: Target,
    folder: Path,
    sigs: Signatures,
    settle: float,
    startup_timeout: float,
    request_timeout: float = 60.0,
) -> Outcome:
    """Start a fresh server for ``target``, send ``script``'s requests to it, and judge."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SCRIPT).write_text(script)
    server = Server(target, folder / schema.SERVER_LOG)
    try:
        server.start()
        server.wait_healthy(startup_timeout)
        watch = crash_watch.CrashWatch(server, folder, sigs)
        watch.healthy_at(server.healthy_at)
        env = {**os.environ, "VLLM_API_KEY": server.api_key or ""}
        cmd = [
            sys.executable,
            str(folder / SCRIPT),
            "--url",
            server.base_url,
            "--json",
            "--settle",
            str(settle),
            "--timeout",
            str(request_timeout),
        ]
        with open(folder / "repro.out", "w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            crash = None
            while proc.poll() is None:
                crash = crash or watch.check()
                time.sleep(TICK)  # observation period, as the campaign runner's
            crash = crash or watch.check()
        watch.finish()
    finally:
        server.stop()
    result = parse_result((folder / "repro.out").read_text()) or {}
    return Outcome(
        crash is not None,
        _name(crash) if crash else None,
        result.get("statuses", []),
        result.get("why"),
        [m.line for m in watch.matches],
        folder,
    )


def _name(crash: crash_watch.Crash) -> str:
    """A crash by its chain of signatures (root first), as the trial's crash table names it."""
    return getattr(crash, "chain", None) or crash.signature


def target_of(manifest: TrialManifest) -> Target:
    """The server a trial ran, from its manifest (secrets there are masked: a masked key is a key all the same,
    since our client sends the same mask)."""
    detail = manifest.target_detail or TargetDetail()
    mode = detail.mode or manifest.target
    if mode == "attach" or mode is None:
        raise ServerError(
            "this trial ran against a server mmchaos did not start (attach): minimizing needs fresh "
            "servers of the same engine and flags"
        )
    return Target(
        mode=mode,
        engine=manifest.engine,
        model=detail.model,
        flags=list(manifest.flags),
        env=dict(manifest.env),
        command=detail.command,
        url=detail.url,
    )
