"""The `mmchaos` command."""

from __future__ import annotations

import argparse
import os
import sys

from rich.markup import escape

from mmchaos.errors import MmchaosError, one_line

from .commands import (
    campaign,
    engine,
    hunt,
    k8s,
    locust_options,
    minimize,
    model,
    predict,
    report,
    repro,
    serve,
    trace,
    versions,
    worker,
)
from .commands.common import CommandError, console, redact_terminal

# one module per command (harness/commands/), in the order `mmchaos --help` lists them
COMMANDS = (
    engine,
    model,
    serve,
    repro,
    versions,
    campaign,
    report,
    predict,
    minimize,
    trace,
    worker,
    k8s,
    hunt,
    locust_options,
)


def _split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after a bare `--` goes to vLLM verbatim."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + error
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("mmchaos")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mmchaos", description=__doc__)
    p.add_argument("--version", action="version", version=f"mmchaos {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    for command in COMMANDS:
        command.add_parser(sub)  # its arguments, and func=run
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    saved = redact_terminal(argv)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _main(argv: list[str]) -> int:
    own, passthrough = _split_passthrough(argv)
    a = build_parser().parse_args(own)
    a.argv = own  # the command line as given, for a command that records it (versions)
    try:
        if passthrough and not hasattr(a, "passthrough"):  # set by the commands that take vLLM's flags
            raise CommandError("flags after -- are only for serve, repro and hunt")
        if hasattr(a, "passthrough"):
            a.passthrough = passthrough
        return a.func(a)
    except MmchaosError as e:  # the one error path: one line, no traceback, the error's exit code
        console.print(f"[red]{escape(e.line())}[/red]")
        return e.exit_code
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say, and no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
