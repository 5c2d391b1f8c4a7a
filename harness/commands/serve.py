"""`mmchaos serve`: launch a server and keep it up until Ctrl-C, with its fault control (faults fired by hand from
Locust's web UI: harness/injection/control.py) and a fault proxy for the network faults."""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape

from mmchaos import paths
from mmchaos.redact import split_command

from ..servers import sigterm
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
    control = proxy = None
    try:
        proxy, control = _fault_control(server, target, log)
        console.print(f"model: {server.model_name()} — Ctrl-C stops the server")
        console.print(
            f"faults by hand: load it with `locust --host {proxy.url} --fault-control {control.url} --server-log "
            f"{log}` (through the fault proxy, so network faults reach the load; the server itself: "
            f"{server.base_url}; --server-log lets the panel name crashes and drift); fault rows in "
            f"{log.with_suffix('')}/faults"
        )
        while server.exit_code() is None:
            control.tick()  # what a fault fired by hand started ends after its duration
            time.sleep(0.5)  # idle wait for the user's Ctrl-C or the server's exit
            sigterm.check()
        console.print(f"server exited with code {server.exit_code()}: {escape(_death(log))}")
        return 1
    except KeyboardInterrupt:
        console.print("stopping server")
        return 0
    finally:
        if control is not None:
            control.stop()
            control.injector.finish(time.time())  # a stopped process continued, a pause resumed
        if proxy is not None:
            proxy.stop()
        server.stop()


def _fault_control(server, target, log: Path):
    """The fault proxy in front of the server and the control endpoint of faults by hand, on loopback."""
    import os
    from urllib.parse import urlsplit

    from mmchaos import faults

    from ..injection.control import FaultControl
    from ..injection.injector import FaultInjector
    from ..injection.proxy import FaultProxy
    from ..servers.server import api_server_count, tensor_parallel_size

    up = urlsplit(server.base_url)
    proxy = FaultProxy(up.hostname or server.host, up.port or 80).start()
    injector = FaultInjector([], log.with_suffix(""), proxy, source="web_ui")
    injector.bind(server.processes(), 0, server.base_url, server.api_key)
    argv = [*split_command(target.command), *target.flags]
    fits = faults.Target(
        started=True,
        tp=tensor_parallel_size(argv),
        api_servers=api_server_count(argv),
        dev_mode=faults.dev_mode({**os.environ, **target.env}),
    )
    return proxy, FaultControl(injector, fits).start()


def _death(log: Path) -> str:
    """How the server died, as a campaign names a crash: the chain of the log's signatures (drift first, the
    assertion last), else its last line."""
    from mmchaos.signatures import UNKNOWN, Signatures

    sigs = Signatures.load()
    matches = sigs.scan(log.read_text(errors="replace")) if log.exists() else []
    if sigs.classify_crash(matches) == UNKNOWN:
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        return f"no known signature in its log; its last line: {lines[-1][:200] if lines else '(empty)'}"
    return f"{sigs.chain(matches)} (log: {log})"
