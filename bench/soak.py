"""Soak: does a long run hold? One Locust process of the default mix at full speed and one at a server-like rate,
side by side against a null endpoint (nginx answering 200), for ``--minutes`` (an hour by default: the two run at
once, so the hour is one hour of wall time).

    .venv/bin/python bench/soak.py [--minutes 60] [--users 16] [--paced-rps 100] [--csv samples.csv]

Every ``--sample`` seconds the resident memory of each Locust process (psutil) and the number of row files in its
results folder are read. At the end each run's rows are compared with Locust's own request count (its --json-file;
rows of requests cut by the end of the run are no Locust request). Goals (issue 16, item 6):

- memory flat within 10 % after warm-up: the median of the last minute over the median of the minute after
  ``--warmup`` minutes (pools, caches and Locust's own tables fill up first), and the peak after warm-up too;
- rows = requests;
- row files a bounded number per minute: the most new files in any minute after the first, per run.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, counted_rows, footer, header, locust_stats, nginx_null, ratio_line, start_locust, stop_group

MEMORY_GOAL = 1.10  # after warm-up, memory within 10 % of its level right after warm-up
FILES_PER_MINUTE = 600  # a bound for row files per minute (each table flushes at most once a second: 60 per table)


@dataclass
class Run:
    name: str
    users: int
    wait_ms: int
    folder: Path
    proc: subprocess.Popen | None = None
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (seconds since start, RSS MB, files)

    def start(self, url: str, minutes: float) -> None:
        self.folder.mkdir(parents=True)
        self.proc = start_locust(
            ROOT / "locustfiles/embeddings.py",
            url,
            self.users,
            int(minutes * 60),
            self.folder,
            [
                "--model",
                "bench",
                "--results-dir",
                str(self.folder / "rows"),
                "--run-id",
                self.name,
                "--wait-ms",
                str(self.wait_ms),
            ],
        )

    def sample(self, t: float) -> None:
        try:
            rss = psutil.Process(self.proc.pid).memory_info().rss / 2**20
        except psutil.Error:
            return
        files = sum(1 for _ in (self.folder / "rows").rglob("*.parquet"))
        self.samples.append((t, rss, files))

    def memory(self, warmup_s: float) -> tuple[float, float, float]:
        """(MB right after warm-up, MB in the last minute, peak MB after warm-up): medians over a minute."""
        after = [s for s in self.samples if s[0] >= warmup_s]
        if not after:
            return float("nan"), float("nan"), float("nan")
        base = statistics.median(m for t, m, _ in after if t < after[0][0] + 60)
        end = statistics.median(m for t, m, _ in after if t > after[-1][0] - 60)
        return base, end, max(m for _, m, _ in after)

    def files_per_minute(self) -> int:
        """The most row files added in any minute after the first (file counts sampled over the run)."""
        most = 0
        for t, _, n in self.samples:
            if t < 60:
                continue
            before = [c for u, _, c in self.samples if u <= t - 60]
            if before:
                most = max(most, n - before[-1])
        return most

    def rows_and_requests(self) -> tuple[int, int]:
        return counted_rows(self.folder / "rows"), locust_stats(self.folder / "locust")["requests"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60)
    p.add_argument("--warmup", type=float, default=5, help="minutes before memory is held to the goal")
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--paced-rps", type=float, default=100, help="the server-like run's rate (think time per user)")
    p.add_argument("--sample", type=float, default=10, help="seconds between readings")
    p.add_argument("--csv", type=Path, help="write every reading here")
    a = p.parse_args()
    if a.minutes <= a.warmup + 1:
        p.error("--minutes must leave at least a minute after --warmup")
    header("bench/soak.py: memory, rows and row files of long runs against a null endpoint")
    # a user's mean think time is wait_ms / 2: users / (wait_ms / 2000 s) requests per second at a fast server
    paced_wait = max(1, round(2000 * a.users / a.paced_rps))
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-soak-") as tmp:
        runs = [
            Run("full-speed", a.users, 0, Path(tmp) / "full"),
            Run("paced", a.users, paced_wait, Path(tmp) / "paced"),
        ]
        with nginx_null() as url:
            print(
                f"null endpoint: nginx at {url}; {a.users} users each; full speed and paced (think time "
                f"uniform in [0, {paced_wait}] ms, ~{a.paced_rps:g} req/s), {a.minutes:g} min",
                flush=True,
            )
            t0 = time.monotonic()
            for r in runs:
                r.start(url, a.minutes)
            try:
                deadline = t0 + a.minutes * 60 + 120
                next_print = 0.0
                while any(r.proc.poll() is None for r in runs) and time.monotonic() < deadline:
                    t = time.monotonic() - t0
                    for r in runs:
                        if r.proc.poll() is None:
                            r.sample(t)
                    if t >= next_print:
                        print(
                            f"  {t / 60:5.1f} min  "
                            + "  ".join(
                                f"{r.name}: {r.samples[-1][1]:6.0f} MB, {r.samples[-1][2]:5d} files"
                                for r in runs
                                if r.samples
                            ),
                            flush=True,
                        )
                        next_print += 300
                    time.sleep(a.sample)  # the sampling period
            finally:
                for r in runs:
                    stop_group(r.proc, 30.0)
        print()
        ok = True
        for r in runs:
            base, end, peak = r.memory(a.warmup * 60)
            rows, requests = r.rows_and_requests()
            stats = locust_stats(r.folder / "locust")
            print(
                f"{r.name}: {requests:,} requests at {stats['rate']:.0f} req/s, {rows:,} rows; memory after "
                f"warm-up {base:.0f} MB, last minute {end:.0f} MB, peak {peak:.0f} MB"
            )
            lines = [
                ratio_line(f"{r.name}: last minute / after warm-up", end / base, MEMORY_GOAL, "x"),
                ratio_line(f"{r.name}: peak / after warm-up", peak / base, MEMORY_GOAL, "x"),
                ratio_line(f"{r.name}: row files per minute", r.files_per_minute(), FILES_PER_MINUTE),
            ]
            for line in lines:
                print(line)
            print(f"{r.name}: every request a row: {'yes' if rows == requests else f'NO ({requests - rows:+,})'}")
            ok &= rows == requests and all(line.endswith("PASS") for line in lines)
        if a.csv:
            with open(a.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["run", "seconds", "rss_mb", "row_files"])
                w.writerows((r.name, f"{t:.1f}", f"{m:.1f}", n) for r in runs for t, m, n in r.samples)
    footer()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
