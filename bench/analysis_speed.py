"""How long the full report takes on a big campaign, and how much memory it needs.

    .venv/bin/python bench/analysis_speed.py [--rows 1000000] [--part-rows 1000] [--keep DIR]

Generates a synthetic campaign (3 configurations x 5 trials, ``--rows`` request rows in part files of
``--part-rows`` rows), then builds the report in a child process and measures that process alone: wall time
(interpreter start and imports included) and peak resident memory. Goals: <= 15 s, <= 2 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic campaign: a test fixture, not installed

GOAL_S = 15.0
GOAL_BYTES = 2 * 1024**3

CHILD = """
import json, sys, time
t = time.perf_counter()
from mmchaos.analysis.report import write_report
imported = time.perf_counter() - t
res = write_report(sys.argv[1], sys.argv[2])
print(json.dumps({"import": imported, **res.timings}))
"""


def main() -> int:
    from synthetic import DEFAULT_CONFIGS, make_campaign

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--part-rows", type=int, default=1000, help="rows per requests part file")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--keep", type=Path, help="generate into this folder and keep it (default: a temp folder)")
    a = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-") as tmp:
        root = a.keep or Path(tmp)
        per_trial = a.rows // (len(DEFAULT_CONFIGS) * a.trials)
        print(
            f"generating {per_trial * len(DEFAULT_CONFIGS) * a.trials:,} request rows "
            f"({len(DEFAULT_CONFIGS)} configs x {a.trials} trials, {a.part_rows:,} rows per part) ...",
            flush=True,
        )
        t = time.perf_counter()
        camp = make_campaign(
            root,
            "bench",
            trials=a.trials,
            requests_per_trial=per_trial,
            duration_s=3600.0,
            part_rows=a.part_rows,
            seed=7,
        )
        n_files = sum(1 for _ in camp.rglob("*.parquet"))
        print(f"  {time.perf_counter() - t:.1f} s, {n_files:,} parquet files", flush=True)

        print("building the report in a child process ...", flush=True)
        t = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(camp), str(root / "report")], cwd=ROOT, capture_output=True, text=True
        )
        wall = time.perf_counter() - t
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return 1
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux reports KiB
        phases = json.loads(child.stdout.strip().splitlines()[-1])

    print(f"wall time   {wall:6.2f} s   goal {GOAL_S:.0f} s   ratio {wall / GOAL_S:.2f}")
    print(f"peak RSS    {peak / 1024**3:6.2f} GB  goal {GOAL_BYTES / 1024**3:.0f} GB   ratio {peak / GOAL_BYTES:.2f}")
    print("phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    return 0 if wall <= GOAL_S and peak <= GOAL_BYTES else 1


if __name__ == "__main__":
    sys.exit(main())
