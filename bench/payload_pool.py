"""Payload pool: time and memory to build 1,000 distinct realistic images from nothing.

    .venv/bin/python bench/payload_pool.py [--quick] [--n 1000] [--reps 1]

Runs ``python -m mmchaos.payloads --n N --cache-dir <empty temp folder>`` (a cold build: every image rendered and
encoded, nothing read from a cache) in a child process and measures that process alone: wall time (interpreter
start and imports included) and peak resident memory (getrusage of the waited-for child). Then a second, warm
build from the cache it just wrote. Goals (cold, n = 1000): <= 10 s, <= 300 MB. ``--quick`` builds 150 images
and scales the time goal by n / 1000 (the memory goal stays).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PY, ROOT, footer, header, ratio_line

GOAL_S = 10.0
GOAL_MB = 300.0


def build(n: int, cache: Path) -> tuple[float, float, dict]:
    """One child build; returns (wall s, peak RSS MB of that child, the child's own summary)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    child = subprocess.run(
        [PY, "-m", "mmchaos.payloads", "--n", str(n), "--cache-dir", str(cache)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - t
    if child.returncode != 0:
        raise SystemExit(f"python -m mmchaos.payloads failed:\n{child.stderr[-2000:]}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux: the max over waited children
    info = json.loads(child.stdout)
    # getrusage(CHILDREN) is a running maximum: when it did not grow, this child's own figure is the one
    return wall, (peak if peak > before else info["peak_rss_mb"] * 1024) / 1024, info


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="150 images (time goal scaled)")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--reps", type=int, default=1, help="cold builds (each into a new empty folder)")
    a = p.parse_args()
    if a.quick:
        a.n = 150
    goal_s = GOAL_S * a.n / 1000
    header("bench/payload_pool.py: cold build of the realistic image pool")
    colds = []
    for rep in range(a.reps):
        with tempfile.TemporaryDirectory(prefix="mmchaos-bench-pool-") as tmp:
            wall, peak, info = build(a.n, Path(tmp))
            assert info["generated"] == a.n and info["from_cache"] == 0, info
            colds.append((wall, peak, info))
            print(
                f"cold build {rep}: {a.n} images in {wall:.2f} s wall (child's own: {info['seconds']:.2f} s build, "
                f"{info['cpu_seconds']:.2f} s CPU), peak RSS {peak:.0f} MB; {info['total_bytes'] / 1e6:.1f} MB of "
                f"images, formats {info['formats']}, median {info['median_pixels']:,} px, "
                f"max side {info['max_long_side']} px",
                flush=True,
            )
            if rep == 0:
                wwall, wpeak, winfo = build(a.n, Path(tmp))
                print(
                    f"warm build (same cache): {wwall:.2f} s wall, peak RSS {wpeak:.0f} MB, "
                    f"{winfo['from_cache']} from cache",
                    flush=True,
                )
    wall = sorted(c[0] for c in colds)[len(colds) // 2]
    peak = max(c[1] for c in colds)
    print()
    print(ratio_line(f"cold build time ({a.n} images)", wall, goal_s, "s"))
    print(ratio_line("cold build peak RSS", peak, GOAL_MB, "MB"))
    footer()
    return 0 if wall <= goal_s and peak <= GOAL_MB else 1


if __name__ == "__main__":
    sys.exit(main())
