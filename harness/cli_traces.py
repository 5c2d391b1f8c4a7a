"""The trace commands of `mmchaos`: minimize a crash, export a trace as a request log, import a request log."""

from __future__ import annotations

import sys
from pathlib import Path

from mmchaos.payloads import request_log, traces

from . import arg_types

COMMANDS = ("minimize", "trace")


def add_parsers(sub, parser_class) -> None:
    m = sub.add_parser(
        "minimize",
        help="shrink a crashing trial to a minimal standalone reproducer and an "
        "issue snippet (each candidate on a fresh server)",
    )
    m.add_argument("trial", help="a crashing trial folder: results/<campaign>/<config>/<trial>")
    m.add_argument("--out", help="where to write (default: TRIAL/minimized); a re-run resumes from it")
    m.add_argument(
        "--repeats",
        type=arg_types.positive_int,
        default=2,
        help="a candidate crashes only if it crashes in K of K fresh servers (default 2)",
    )
    m.add_argument("--max-starts", type=arg_types.positive_int, default=40, help="most server starts (default 40)")
    m.add_argument("--max-minutes", type=arg_types.positive_number, default=60, help="most wall time (default 60)")
    m.add_argument(
        "--settle",
        type=arg_types.positive_number,
        default=10,
        help="seconds to watch the server after a candidate's last request (default 10)",
    )
    m.add_argument(
        "--keep-images",
        action="store_true",
        help="keep every image as recorded: try no fewer or smaller images (each try costs starts)",
    )
    m.add_argument(
        "--startup-timeout", type=arg_types.positive_number, default=420, help="seconds for a server to start"
    )
    t = sub.add_parser("trace", help="convert traces and request logs (JSONL; docs/request-log.md)")
    tsub = t.add_subparsers(dest="trace_action", required=True, parser_class=parser_class)
    te = tsub.add_parser("export", help="a run's trace as a JSONL request log (images as files beside it)")
    te.add_argument("folder", help="a folder holding a trace: a trial, an ad-hoc run")
    te.add_argument("log", help="the .jsonl file to write")
    ti = tsub.add_parser("import", help="a JSONL request log as a trace folder (replay it, export it again)")
    ti.add_argument("log", help="the .jsonl request log")
    ti.add_argument("folder", help="the folder to write (must not hold a trace yet)")


def run(a, say) -> int:
    if a.cmd == "minimize":
        return _minimize(a, say)
    if a.trace_action == "export":
        n = request_log.write(traces.Trace.load(a.folder), a.log)
        say(f"{a.log}: {n} requests (images in {Path(a.log).with_name(Path(a.log).stem + '.images')})")
        return 0
    folder = Path(a.folder)
    if (folder / "trace").exists():
        raise traces.TraceError(f"{folder} already holds a trace: pick a new folder")
    trace = request_log.read(a.log)
    traces.save(trace, folder)
    say(f"{folder}: {len(trace)} requests of {len(trace.lanes())} sessions")
    return 0


def _minimize(a, say) -> int:
    from . import bug_report
    from .minimize import Minimizer

    out = Path(a.out) if a.out else Path(a.trial) / "minimized"
    m = Minimizer(
        Path(a.trial),
        out,
        repeats=a.repeats,
        max_starts=a.max_starts,
        max_minutes=a.max_minutes,
        settle=a.settle,
        startup_timeout=a.startup_timeout,
        keep_images=a.keep_images,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    say(
        f"minimizing {len(m.start)} requests that preceded the crash ({m.signature}); every candidate runs on a "
        f"fresh server, {a.repeats} time(s)"
    )
    result = m.run()
    files = bug_report.write(m, result)
    state = "minimal and confirmed" if result.confirmed else result.note
    say(f"{len(result.trace)} request(s): {state}")
    for name, path in files.items():
        say(f"  {name}: {path}")
    return 0 if result.confirmed else 1
