"""What several commands share: the terminal they talk on (its secrets masked), their own one-line error, and the
server target of serve and repro."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mmchaos.errors import MmchaosError
from mmchaos.redact import RedactingStream, Redactor, flag_values, split_command

from .. import arg_types
from ..servers import model as model_build
from ..servers.server import Server, ServerError, Target

# wide enough for the campaign tables when the output is a file or a CI log (rich assumes 80 there)
console = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)


class CommandError(MmchaosError):
    """One line: what is wrong with the command as given, or why it cannot run; what to do."""


def listing(columns: list[tuple[str, str]], rows: Sequence[Sequence[str]], keep_whole: int = 2) -> None:
    """A list command's answer on stdout: a table on a terminal (the first ``keep_whole`` columns never wrapped:
    names are what people copy), tab-separated lines under a header when piped (nothing cut). ``columns``: (name
    in the header line, title in the table)."""
    if not sys.stdout.isatty():
        print("\t".join(name for name, _ in columns))
        for row in rows:
            print("\t".join(row))
        return
    t = Table(*(escape(title) for _, title in columns))
    for c in t.columns[:keep_whole]:
        c.no_wrap = True
    for row in rows:
        t.add_row(*(escape(x) for x in row))
    Console(highlight=False).print(t)


def say(line: str) -> None:
    """A line of progress on the terminal, printed as written (no markup)."""
    console.print(escape(line))


def redact_terminal(argv: list[str]) -> tuple:
    """From here on, nothing written to the terminal carries a secret: this process's (MMCHAOS_API_KEY, ...) and
    those on its command line (--api-key, inside --command too). Returns the streams to put back."""
    extra = [v for arg in argv for v in flag_values(split_command(arg))] + flag_values(argv)
    redactor = Redactor.from_environment(extra)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout, redactor), RedactingStream(sys.stderr, redactor)
    return saved


def also_redact(values) -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, RedactingStream):
            stream.redactor = stream.redactor.with_values(values)


# --- the server of serve and repro ---------------------------------------------------------------------------


def add_server_args(s) -> None:
    """What to load, and how long to wait for it: the arguments serve and repro share."""
    s.add_argument("--engine", help="vLLM version to launch on the tiny model (embedded engine)")
    s.add_argument(
        "--model",
        help=f"for --engine: a model name ({', '.join(model_build.RECIPES)}) or folder "
        "(default: the tiny Qwen3-VL embedder)",
    )
    s.add_argument("--command", help="launch this server command instead ({port} and {host} substituted)")
    s.add_argument(
        "--url", type=arg_types.url, help="base URL: of --command's server, or of a running server to attach to"
    )
    s.add_argument("--port", type=arg_types.port, help="port to launch on, 1-65535 (default: a free one)")
    s.add_argument(
        "--server-log",
        "--log",
        dest="log",
        help="the server's log file: written when mmchaos launches it, read when attached (--log: old name)",
    )
    s.add_argument(
        "--startup-timeout",
        "--timeout",
        dest="timeout",
        type=float,
        default=300,
        help="seconds to wait for /health (default 300; --timeout: old name)",
    )
    s.set_defaults(passthrough=[])  # flags after -- go to vLLM verbatim


def target_from_args(a, flags: list[str]) -> Target:
    modes = [m for m in ("engine", "command", "url") if getattr(a, m, None)]
    if a.command and a.url:
        return Target(mode="command", command=a.command, url=a.url, flags=flags)
    if len(modes) != 1:
        raise CommandError("say what to load: --engine VERSION, --command 'CMD ... {port}' or --url URL")
    if a.engine:
        return Target(mode="engine", engine=a.engine, model=model_build.resolve(a.model), flags=flags)
    if a.command:
        if flags:
            raise CommandError("with --command, put the server's flags in the command itself")
        return Target(mode="command", command=a.command)
    return Target(mode="attach", url=a.url)


def start(target: Target, log: Path, port: int | None, timeout: float) -> Server:
    server = Server(target, log, port=port)
    server.start()
    if target.mode == "attach":
        ok, status, err = server.health(timeout=5)
        if not ok:
            raise ServerError(f"{server.base_url}/health did not answer 200 ({status or err}): is the server up?")
        return server
    try:
        with console.status("starting server") as spinner:
            waited = server.wait_healthy(
                timeout,
                progress=lambda t, line: spinner.update(
                    f"starting server ({t:.0f} s): [dim]{escape(line[-100:])}[/dim]"
                ),
            )
    except BaseException:
        server.stop()
        raise
    console.print(f"server healthy at {server.base_url} after {waited:.0f} s (log: {log})")
    return server
