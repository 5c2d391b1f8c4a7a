"""`mmchaos trace`: a run's trace as a JSONL request log, and a request log as a trace (docs/request-log.md)."""

from __future__ import annotations

from pathlib import Path

from mmchaos.payloads import request_log, traces

from .common import say


def add_parser(sub) -> None:
    t = sub.add_parser("trace", help="convert traces and request logs (JSONL; docs/request-log.md)")
    tsub = t.add_subparsers(dest="trace_action", required=True)  # the parser class: t's own, one-line errors
    te = tsub.add_parser("export", help="a run's trace as a JSONL request log (images as files beside it)")
    te.add_argument("folder", help="a folder holding a trace: a trial, an ad-hoc run")
    te.add_argument("log", help="the .jsonl file to write")
    ti = tsub.add_parser("import", help="a JSONL request log as a trace folder (replay it, export it again)")
    ti.add_argument("log", help="the .jsonl request log")
    ti.add_argument("folder", help="the folder to write (must not hold a trace yet)")
    t.set_defaults(func=run)


def run(a) -> int:
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
