"""`mmchaos hunt`: its arguments and the one-line errors of bad input."""

from __future__ import annotations

import time
from pathlib import Path

from mmchaos import paths
from mmchaos.signatures import Signatures

from . import arg_types
from .server import Target

COMMANDS = ("hunt",)


class HuntUsageError(Exception):
    """One line: what is wrong with the hunt's arguments or target."""


def add_parsers(sub) -> None:
    h = sub.add_parser("hunt", help="search a server for crashes and wrong answers nobody listed: stateful cases "
                                    "generated from its /openapi.json, checked by oracles, shrunk to reproducers; "
                                    "exit 0 nothing found, 1 findings, 2 could not run")
    h.add_argument("--engine", help="vLLM version to launch on the tiny model (flags after --)")
    h.add_argument("--model", help="model dir for --engine (default: the tiny model)")
    h.add_argument("--command", help="launch this server command instead ({port} and {host} substituted)")
    h.add_argument("--url", help="a running server to attach to (no shrinking: that needs fresh servers)")
    h.add_argument("--out", help=f"results folder (default: {paths.results_dir()}/hunt-<time>); a re-run resumes")
    h.add_argument("--max-minutes", type=arg_types.positive_number, default=30, help="default 30")
    h.add_argument("--max-starts", type=arg_types.positive_int, default=20,
                   help="server starts, shrinking included (default 20)")
    h.add_argument("--max-requests", type=arg_types.positive_int, default=2000, help="default 2000")
    h.add_argument("--seed", type=int, default=0, help="default 0")
    h.add_argument("--timeout", type=arg_types.positive_number, default=300,
                   help="seconds to wait for each server's /health (default 300)")
    h.add_argument("--signatures", nargs="*", default=[], help="extra signature TOML files")


def run(a, flags: list[str], say) -> int:
    from .hunt import Budget, Hunt, HuntError, Stop
    from .hunt_api import ApiError
    from .server import ServerError

    modes = [m for m in ("engine", "command", "url") if getattr(a, m)]
    if len(modes) != 1:
        raise HuntUsageError("say what to hunt on: --engine VERSION [-- flags], --command 'CMD ... {port}' or "
                             "--url URL")
    if flags and not a.engine:
        raise HuntUsageError("flags after -- go with --engine")
    target = (Target(mode="engine", engine=a.engine, model=a.model, flags=flags) if a.engine else
              Target(mode="command", command=a.command) if a.command else Target(mode="attach", url=a.url))
    out = Path(a.out or paths.results_dir() / f"hunt-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    hunt = Hunt(target, out, Budget(a.max_minutes, a.max_starts, a.max_requests), a.seed, say,
                Signatures.load(*a.signatures), start_timeout=a.timeout)
    try:
        return hunt.run()
    except (HuntError, ApiError, ServerError) as e:
        raise HuntUsageError(str(e)) from e
    except Stop as e:
        raise HuntUsageError(f"the hunt could not run: {e}") from e
