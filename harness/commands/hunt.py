"""`mmchaos hunt`: its options and its run (harness/hunt.py does the search)."""

from __future__ import annotations

import shlex
from pathlib import Path

from mmchaos import paths

from .. import arg_types
from ..hunt import axis as hunt_axis
from ..hunt import flag_draw as hunt_flag_draw
from ..hunt import versions as hunt_versions
from ..hunt.corpus import MUTATE_SHARE
from ..servers import engines, sigterm
from ..servers.server import Target
from .common import CommandError, say


def add_parser(sub) -> None:
    h = sub.add_parser(
        "hunt",
        help="search for crashes and wrong answers nobody listed: requests generated from the "
        "server's own /openapi.json, judged by oracles, crashes shrunk to reproducers; "
        "exit 0 nothing found, 1 findings, 2 could not run",
        description="Flags after -- go to vLLM verbatim (with --engine).",
    )
    h.add_argument("--engine", help="vLLM version to launch on the tiny model")
    h.add_argument("--model", help="model dir for --engine (default: the tiny model)")
    h.add_argument("--command", help="launch this server command instead ({port} and {host} substituted)")
    h.add_argument("--url", type=arg_types.url, help="attach to the server at this URL (a crash then ends the hunt)")
    h.add_argument(
        "--operator-actions",
        action="store_true",
        help="launch the server with VLLM_SERVER_DEV_MODE=1, so cases also act on it as an operator would, "
        "between and beside requests (/reset_mm_cache, /reset_prefix_cache, /sleep and /wake_up, /pause and /resume)",
    )
    h.add_argument(
        "--reference",
        metavar="FLAGS_OR_URL",
        help="a second server every answer with vectors or scores is compared with (differential testing): vLLM "
        "flags for "
        'the --engine version (e.g. "--mm-processor-cache-gb 0": no cache to drift from), or the URL of a '
        "running server",
    )
    h.add_argument(
        "--versions",
        action="append",
        default=[],
        metavar="SPEC",
        help="run each crash's reproducer again on this version and its vLLM flags, e.g. 0.32.0 or "
        '"0.30.0 --mm-processor-cache-gb 0" (repeatable): the finding\'s affected-versions line',
    )
    h.add_argument(
        "--flags-axis",
        action="append",
        default=[],
        metavar="FLAGS",
        help="hunt with each of these vLLM flag sets on servers of its own, the budget shared evenly (repeatable; "
        '"default": processor cache tiny and off, shm, 2 API servers, TP 2; "auto" or "auto:N": N sets (3) drawn '
        "from the --engine version's own serve --help); each finding says its flags",
    )
    h.add_argument("--server-log", help="with --url: the server's log file, so the log oracles can read it")
    h.add_argument("--out", help="the hunt's folder (default results/hunt-<target>); a re-run resumes from it")
    h.add_argument("--seed", type=int, default=0, help="the search's seed (default 0)")
    h.add_argument("--max-minutes", type=float, default=30, help="stop after this long (default 30)")
    h.add_argument("--max-starts", type=int, default=10, help="server starts, the minimizer's included (default 10)")
    h.add_argument("--max-requests", type=int, default=2000, help="requests sent by the search (default 2000)")
    h.add_argument("--max-cases", type=int, default=500, help="cases sent (default 500)")
    h.add_argument(
        "--settle", type=float, default=1.0, help="seconds the server is watched after each case (default 1)"
    )
    h.add_argument(
        "--request-timeout",
        type=arg_types.positive_number,
        default=60.0,
        help="seconds a request may go unanswered before it is a hang finding (default 60)",
    )
    h.add_argument(
        "--repeats",
        type=arg_types.positive_int,
        default=2,
        help="runs of each candidate on a fresh server when shrinking a crash (default 2)",
    )
    h.add_argument(
        "--no-minimize",
        action="store_true",
        help="keep each crash's case, do not shrink it (nor try findings on fresh servers)",
    )
    h.add_argument(
        "--no-coverage",
        action="store_true",
        help="do not measure which of vLLM's lines the cases reach (with --engine it is measured in every server "
        "process and steers the search; the report says how much was reached)",
    )
    h.add_argument(
        "--mutants",
        type=float,
        default=MUTATE_SHARE,
        metavar="SHARE",
        help=f"share of the cases made by changing a case that taught the search something (default "
        f"{MUTATE_SHARE:g}; 0: every case drawn afresh)",
    )
    h.add_argument(
        "--startup-timeout",
        "--timeout",
        dest="timeout",
        type=float,
        default=420,
        help="seconds to wait for a server's /health (default 420; --timeout: old name)",
    )
    h.set_defaults(func=run, passthrough=[])  # flags after -- go to vLLM verbatim


def run(a) -> int:
    from ..hunt.search import Budget, Hunt  # its HuntError is an MmchaosError: the command line says it

    passthrough = a.passthrough
    if not 0 <= a.mutants < 1:
        raise CommandError(f"--mutants {a.mutants:g}: give a share from 0 to below 1")
    chosen = [x for x in (a.engine, a.command, a.url and not a.command and a.url) if x]
    if len(chosen) != 1:
        raise CommandError("give one target: --engine VERSION, --command CMD or --url URL")
    env = {"VLLM_SERVER_DEV_MODE": "1"} if a.operator_actions else {}
    for spec in a.versions:
        try:
            hunt_versions.parse(spec)
        except ValueError as e:
            raise CommandError(str(e)) from e
        if not a.engine and not a.command:
            raise CommandError("--versions runs reproducers on servers mmchaos launches: give --engine")
    if a.reference and not a.engine and not a.reference.startswith(("http://", "https://")):
        raise CommandError("--reference FLAGS launches the --engine version with them: give --engine, or a URL")
    if a.flags_axis and not (a.engine or a.command):
        raise CommandError("--flags-axis launches servers with each flag set: give --engine or --command")
    if any(hunt_flag_draw.count(x) is not None for x in a.flags_axis) and not a.engine:
        raise CommandError("--flags-axis auto draws from the --engine version's own help: give --engine")
    if any(hunt_flag_draw.count(x) == 0 for x in a.flags_axis):
        raise CommandError("--flags-axis auto:0 draws no flag set: give auto:N with N of 1 or more")
    if a.operator_actions and not (a.engine or a.command):
        raise CommandError("--operator-actions is for a server mmchaos launches (--engine or --command)")
    if a.engine:
        target = Target(mode="engine", engine=a.engine, model=a.model, flags=list(passthrough), env=env)
    elif a.command:
        target = Target(mode="command", command=a.command, url=a.url, flags=list(passthrough), env=env)
    else:
        target = Target(mode="attach", url=a.url)
    name = a.engine or ("command" if a.command else "attach")
    tag = "-".join([name, *[f.lstrip("-") for f in passthrough]])[:60] if passthrough else name
    out = Path(a.out) if a.out else paths.PROJECT_ROOT / "results" / f"hunt-{tag}"
    budget = Budget(a.max_minutes, a.max_starts, a.max_requests, a.max_cases)

    def make(target, out, budget):
        return Hunt(
            target,
            out,
            budget,
            seed=a.seed,
            settle=a.settle,
            request_timeout=a.request_timeout,
            startup_timeout=a.timeout,
            minimize=not a.no_minimize,
            repeats=a.repeats,
            server_log=Path(a.server_log) if a.server_log else None,
            reference=a.reference,
            versions=list(a.versions),
            coverage=not a.no_coverage,
            mutate_share=a.mutants,
            say=say,
        )

    sigterm.as_ctrl_c()  # its servers are stopped, its state kept, as on Ctrl-C
    say(f"hunt: {target.mode} {shlex.join([name, *passthrough])} -> {out}")
    if not a.flags_axis:
        return make(target, out, budget).run()

    def drawn(n: int) -> list[list[str]]:
        try:
            options = hunt_flag_draw.parse(engines.require(a.engine).serve_help())
        except engines.EngineError as e:
            raise CommandError(str(e)) from e
        sets = hunt_flag_draw.draw(options, n, a.seed)
        say(f"hunt: flags axis auto: {len(sets)} set(s) drawn from {len(options)} options of vLLM {a.engine}'s help")
        return sets

    results = hunt_axis.run(make, target, hunt_axis.expand(a.flags_axis, drawn), out, budget, say)
    shown = make(target, out, budget).shown
    say("hunt: flags axis:")
    for r in results:
        say(f"  {r.line(lambda flags: shown(shlex.join(flags)))}")
    if all(r.code is None for r in results):
        raise CommandError("vLLM refused every flag set of --flags-axis at start-up (each said why above)")
    return 1 if any(r.findings for r in results) else 0
