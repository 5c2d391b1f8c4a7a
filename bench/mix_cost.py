"""What the whole default mix costs the load generator: one Locust process of mmchaos against a null endpoint, with
every route kind and documents on (the routes given with --routes: nginx lists none), beside the same mix with them
off (the mix before they came), interleaved.

    .venv/bin/python bench/mix_cost.py [--quick] [--users 16] [--seconds 20] [--reps 2]

Requests per CPU-second of the Locust process's main thread (psutil's thread times from 3 s in, after start-up and
the first document pages' templates). Goal (issue 38): the whole mix >= 0.8x the mix without routes and documents.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, footer, header, load, nginx_null, rate_arguments, ratio_line, run_locust

from mmchaos.payloads import routes

GOAL = 0.8
MIXES = {
    "whole mix": ["--routes", ",".join(routes.PATHS)],
    "no routes, no documents": [
        x for k in (*routes.ROUTE_KINDS, "document") for x in (f"--weight-{k.replace('_', '-')}", "0")
    ],
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rate_arguments(p)
    a = p.parse_args()
    if a.quick:
        a.seconds, a.reps = 6, 1
    header("bench/mix_cost.py: what the whole default mix costs the generator")
    per_cpu: dict[str, list[float]] = {m: [] for m in MIXES}
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-mix-") as tmp, nginx_null() as url:
        print(f"null endpoint: nginx at {url}; {a.users} users, {a.seconds} s per run, {a.reps} rep(s)", flush=True)
        for rep in range(a.reps):
            for name, args in MIXES.items():
                out = Path(tmp) / f"{rep}-{len(per_cpu[name])}-{name.split()[0]}"
                extra = ["--model", "bench", "--results-dir", str(out / "rows"), "--run-id", f"b{rep}", *args]
                got = run_locust(ROOT / "locustfiles/embeddings.py", url, a.users, a.seconds, out, extra)
                per_cpu[name].append(1e6 / got["main_us"])
                print(
                    f"rep {rep} {name:24} {got['rate']:7.1f} req/s, main thread {got['main_us']:5.0f} us/request "
                    f"({1e6 / got['main_us']:6.0f} per CPU-second), load {load()}",
                    flush=True,
                )
    whole, before = (statistics.median(per_cpu[m]) for m in MIXES)
    print(ratio_line("whole mix / before, requests per CPU-second", whole / before, GOAL, higher_is_better=True))
    footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
