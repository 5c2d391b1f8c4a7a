"""`mmchaos minimize`: shrink a crashing trial to a minimal standalone reproducer and an issue snippet."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import arg_types
from .common import say


def add_parser(sub) -> None:
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
        "--startup-timeout",
        type=arg_types.positive_number,
        default=420,
        help="seconds to wait for each server's /health (default 420)",
    )
    m.set_defaults(func=run)


def run(a) -> int:
    from ..minimize import bug_report
    from ..minimize.minimizer import Minimizer

    out = Path(a.out) if a.out else Path(a.trial) / "minimized"
    m = Minimizer.from_trial(
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
