"""What keeping the trace costs: the load generator's rate with and without it, and the trace's disk size next to
the rows'.

    .venv/bin/python bench/trace_cost.py [--quick] [--users 16] [--seconds 20] [--reps 3]

Against a null endpoint (nginx answering 200, as bench/loadgen.py), one Locust process of the realistic mix runs
``--reps`` times with the trace (the default) and without it (``--no-trace``), interleaved, so a burst of load from
other users of the machine hits both alike. Each run's tables are compacted as a campaign trial's are, then
measured. Goals: the rate with the trace >= 0.9x the rate without (median of the pairs); the trace (its requests
table and its image store) a small fraction of the rows' size. Exact bytes are checked elsewhere
(tests/test_traces.py); here, every traced request is also checked to have a row.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, footer, header, load, nginx_null, rate_arguments, ratio_line, run_locust

RATE_GOAL = 0.9
SIZE_GOAL = 0.5  # trace + images, as a share of the rows' bytes


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.parquet")) if folder.is_dir() else 0


def _run(url: str, users: int, seconds: int, out: Path, rep: int, trace: bool) -> dict:
    from mmchaos.tables import compact, read_table, table_dir

    rows = out / "rows"
    r = run_locust(
        ROOT / "locustfiles/embeddings.py",
        url,
        users,
        seconds,
        out,
        ["--model", "bench", "--results-dir", str(rows), "--run-id", f"bench{rep}", *([] if trace else ["--no-trace"])],
    )
    for table in ("requests", "trace", "trace_images"):
        compact(table_dir(rows, table))
    r["rows_bytes"], r["trace_bytes"], r["images_bytes"] = (
        _bytes(table_dir(rows, t)) for t in ("requests", "trace", "trace_images")
    )
    r["rows"] = read_table(rows, "requests").num_rows
    r["traced"] = read_table(rows, "trace").num_rows if trace else 0
    r["load"] = load()
    return r


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rate_arguments(p)
    a = p.parse_args()
    if a.quick:
        a.seconds, a.reps = 6, 1
    header("bench/trace_cost.py: the trace's cost in rate and disk")
    pairs = []
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-trace-") as tmp, nginx_null() as url:
        tmp = Path(tmp)
        print(
            f"null endpoint: nginx at {url}; {a.users} users, {a.seconds} s per run, {a.reps} interleaved rep(s)",
            flush=True,
        )
        for rep in range(a.reps):
            on = _run(url, a.users, a.seconds, tmp / f"on{rep}", rep, trace=True)
            off = _run(url, a.users, a.seconds, tmp / f"off{rep}", rep, trace=False)
            pairs.append((on, off))
            print(
                f"rep {rep}: with trace {on['rate']:8.1f} req/s ({on['rows']} rows, {on['traced']} traced, "
                f"load {on['load']})  without {off['rate']:8.1f} req/s (load {off['load']})  ratio "
                f"{on['rate'] / off['rate']:.3f}; bytes: rows {on['rows_bytes']:,}, trace {on['trace_bytes']:,}, "
                f"images {on['images_bytes']:,}",
                flush=True,
            )
    rate = statistics.median(on["rate"] / off["rate"] for on, off in pairs)
    size = statistics.median((on["trace_bytes"] + on["images_bytes"]) / on["rows_bytes"] for on, _ in pairs)
    per_request = statistics.median((on["trace_bytes"] + on["images_bytes"]) / on["rows"] for on, _ in pairs)
    rows_per_request = statistics.median(on["rows_bytes"] / on["rows"] for on, _ in pairs)
    missing = sum(on["traced"] - on["rows"] for on, _ in pairs if on["traced"] > on["rows"])
    print()
    print(f"per request: rows {rows_per_request:.1f} B, trace and images {per_request:.1f} B")
    print(ratio_line("rate with trace / without", rate, RATE_GOAL, "x", higher_is_better=True))
    print(ratio_line("trace + images / rows (bytes)", size, SIZE_GOAL, "x"))
    print(f"every traced request has a row: {'yes' if missing == 0 else f'NO ({missing} without)'}")
    footer()
    return 0 if rate >= RATE_GOAL and size <= SIZE_GOAL and missing == 0 else 1


if __name__ == "__main__":
    t0 = time.time()
    sys.exit(main())
