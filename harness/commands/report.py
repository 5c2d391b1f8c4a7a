"""`mmchaos report`: the report of a campaign (Markdown and one HTML file), and its verdicts checked on request."""

from __future__ import annotations

import sys

from rich.markup import escape

from mmchaos.faults import DEFAULT_RECOVER_S, WEDGE_S
from mmchaos.verdict_rule import LEVELS

from ..arg_types import positive_number
from .common import CommandError, console
from .predict import add_traffic_args, traffic


def add_parser(sub) -> None:
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
    r.add_argument("--window", type=positive_number, default=10.0, help="attribution window in seconds (default 10)")
    r.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="CONFIG=VERDICT",
        help="exit 1 unless CONFIG's verdict is VERDICT (fails, retryable or clean); repeatable",
    )
    r.add_argument(
        "--max-wedge-s",
        type=positive_number,
        metavar="S",
        help=f"exit 1 if a fault left /health answering 200 without service for S seconds or more (without it: "
        f"judged at {WEDGE_S:g} s, no exit code)",
    )
    r.add_argument(
        "--max-recovery-s",
        type=positive_number,
        metavar="S",
        help=f"exit 1 if the server did not serve again within S seconds of a fault (without it: judged at "
        f"{DEFAULT_RECOVER_S:g} s, no exit code)",
    )
    r.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    add_traffic_args(
        r.add_argument_group(
            "predict at your traffic (the crash-hazard section gives the mean time between crashes at it)"
        ),
        required=False,
    )
    r.set_defaults(func=run)


def _expectations(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        cfg, sep, level = pair.partition("=")
        if not sep or not cfg or level not in LEVELS:
            raise CommandError(f"--expect {pair!r}: write CONFIG=VERDICT with VERDICT one of {', '.join(LEVELS)}")
        out[cfg] = level
    return out


def run(a) -> int:
    from mmchaos.analysis import report

    expect = _expectations(a.expect)
    if expect and not a.compare:  # the names are checked before the report is made, not after
        from pathlib import Path

        from mmchaos.analysis.results import find_trials

        have = sorted({cfg for cfg, _, _ in find_trials(Path(a.results_dir))}) if Path(a.results_dir).is_dir() else []
        unknown = [cfg for cfg in expect if have and cfg not in have]
        if unknown:
            raise CommandError(
                f"--expect {unknown[0]}: no such configuration in {a.results_dir} (have: {', '.join(have)})"
            )
    progress = None if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    res = report.write_report(
        a.results_dir,
        a.out,
        a.baseline,
        a.compare,
        window_s=a.window,
        progress=progress,
        traffic=traffic(a),
        fault_bounds={k: v for k, v in (("wedge_s", a.max_wedge_s), ("recover_s", a.max_recovery_s)) if v is not None},
    )
    print(res.html)
    code = 0
    for cfg, want in expect.items():
        got = res.verdicts.get(cfg)
        if got is None:
            raise report.ReportError(f"--expect {cfg}: no such configuration (have: {', '.join(res.verdicts)})")
        if got != want:
            console.print(f"[red]mmchaos report: {cfg}: verdict {got}, expected {want}[/red]")
            code = 1
        else:
            console.print(f"{cfg}: verdict {got}, as expected")
    if a.max_wedge_s is not None or a.max_recovery_s is not None:
        for line in res.failed_faults:
            console.print(f"[red]mmchaos report: fault failed: {escape(line)}[/red]")
            code = 1
        if not res.failed_faults:
            console.print("no fault wedged the server or kept it from serving past the bounds")
    return code
