"""`mmchaos serve`: launch a server and keep it up until Ctrl-C."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from mmchaos import paths

from .. import sigterm
from .common import CommandError, add_server_args, console, start, target_from_args

HELP = "launch a server and keep it up until Ctrl-C; flags after -- go to vLLM verbatim"


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help=HELP, description=HELP)
    add_server_args(s)
    s.set_defaults(func=run)


def run(a) -> int:
    target = target_from_args(a, a.passthrough)
    if target.mode == "attach":
        raise CommandError("serve launches a server; to check a running one use `mmchaos repro --url URL`")
    log = Path(a.log or paths.home() / "logs" / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.log")
    server = start(target, log, a.port, a.timeout)
    sigterm.as_ctrl_c()
    try:
        console.print(f"model: {server.model_name()} — Ctrl-C stops the server")
        while server.exit_code() is None:
            time.sleep(0.5)  # idle wait for the user's Ctrl-C or the server's exit
        console.print(f"server exited with code {server.exit_code()}: {escape(server.last_log_line())}")
        return 1
    except KeyboardInterrupt:
        console.print("stopping server")
        return 0
    finally:
        server.stop()
