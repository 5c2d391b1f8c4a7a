"""How fast the hunt finds what it finds: per seed, the cases, requests, server starts and minutes to the first
finding of each oracle, and to the report's crash on vLLM 0.30.0 default (the server start it came on: 1 is the
first); cases a minute and requests a case.

    .venv/bin/python bench/hunt_speed.py [--engine 0.30.0] [--seeds 0 1 2] [--max-cases 40] [--coverage both]
                                         [-- vLLM flags]

``--coverage both`` runs each seed with vLLM's coverage measured and without (--no-coverage), one after the other,
and prints the cost of measuring: cases a minute and requests a second of the search (server starts left out) with
and without, and the lines the cases reached.

Each seed is one `mmchaos hunt` (its own server starts, no shrinking: --no-minimize) in a temp folder, read back
from its state.json and cases.jsonl. The minutes count from the hunt's start, its first server start (~35 s)
included. Everything runs on 127.0.0.1, one vLLM server at a time, each stopped by its recorded process group.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import footer, header

SEED_CRASH = "crash|cache_drift → detokenizer_assert"


def one(engine: str, seed: int, max_cases: int, flags: list[str], out: Path, coverage: bool = True) -> dict:
    cmd = [sys.executable, "-m", "mmchaos.harness.cli", "hunt", "--engine", engine, "--out", str(out)]
    cmd += [] if coverage else ["--no-coverage"]
    cmd += ["--seed", str(seed), "--max-cases", str(max_cases), "--max-starts", "8", "--no-minimize"]
    cmd += ["--max-minutes", "30"] + (["--", *flags] if flags else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode not in (0, 1):
        raise SystemExit(f"hunt failed (exit {r.returncode}):\n" + "\n".join(r.stderr.strip().splitlines()[-40:]))
    state = json.loads((out / "state.json").read_text())
    cases = [json.loads(x) for x in (out / "cases.jsonl").read_text().split("\n") if x.strip()]
    first: dict[str, dict] = {}
    requests = 0
    for c in cases:
        requests += len(c["steps"])
        for fp in c["findings"]:
            oracle = fp.split("|", 1)[0]
            for key in {oracle, fp} if fp == SEED_CRASH else {oracle}:
                first.setdefault(
                    key, {"case": c["case"], "requests": requests, "start": c["start"], "minutes": c["seconds"] / 60}
                )
    # the search's own seconds: from the first case's end back to its start is unknown, so from the first case's end
    # to the last's, over the cases and requests after the first (a server start in between is left out)
    starts = {c["start"] for c in cases}
    same = [c for c in cases if c["start"] == min(starts)]
    span = same[-1]["seconds"] - same[0]["seconds"] if len(same) > 1 else float("nan")
    rate = {
        "cases_per_min": (len(same) - 1) / span * 60 if span else float("nan"),
        "requests_per_s": sum(len(c["steps"]) for c in same[1:]) / span if span else float("nan"),
    }
    return {"seed": seed, "state": state, "first": first, "cases": len(cases), "requests": requests, "rate": rate}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", default="0.30.0")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max-cases", type=int, default=40)
    p.add_argument("--coverage", choices=("on", "off", "both"), default="on")
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    header(f"hunt speed: vLLM {a.engine} {' '.join(flags) or '(default flags)'}, seeds {a.seeds}")
    runs = []
    modes = {"on": [True], "off": [False], "both": [True, False]}[a.coverage]
    measured: dict[bool, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="mmchaos-hunt-speed-") as tmp:
        for s, cov in [(s, m) for s in a.seeds for m in modes]:
            run = one(a.engine, s, a.max_cases, flags, Path(tmp) / f"seed-{s}-{cov}", cov)
            measured[cov].append(run)
            if cov != modes[0]:
                continue  # the other mode is for the cost of measuring only
            st = run["state"]
            minutes = st["seconds"] / 60
            firsts = ", ".join(
                f"{k} at case {v['case']} ({v['requests']} req, start {v['start']}, {v['minutes']:.1f} min)"
                for k, v in sorted(run["first"].items())
            )
            print(
                f"seed {s}: {run['cases']} cases, {run['requests']} requests, {st['starts']} start(s), "
                f"{minutes:.1f} min ({run['cases'] / minutes:.1f} cases/min, {run['requests'] / run['cases']:.1f} "
                f"requests/case); first: {firsts or 'nothing'}",
                flush=True,
            )
            runs.append(run)
    if len(modes) == 2:
        for what in ("cases_per_min", "requests_per_s"):
            on = statistics.median(r["rate"][what] for r in measured[True])
            off = statistics.median(r["rate"][what] for r in measured[False])
            print(f"{what.replace('_', ' ')}: {on:.2f} measuring coverage, {off:.2f} without ({on / off:.2f}x)")
    for r in measured.get(True, []):
        areas = r["state"].get("coverage", {}).get("areas", {})
        print(
            f"seed {r['seed']}: vLLM lines the cases ran: "
            + ", ".join(f"{k} {v['by_cases']}" for k, v in areas.items())
        )
    found = [r["first"][SEED_CRASH] for r in runs if SEED_CRASH in r["first"]]
    line = f"the report's crash found by {len(found)} of {len(runs)} seed(s)"
    if found:
        cases, minutes = [f["case"] for f in found], [f["minutes"] for f in found]
        line += (
            f": median case {statistics.median(cases):g} ({min(cases)}-{max(cases)}), "
            f"median {statistics.median(minutes):.1f} min ({min(minutes):.1f}-{max(minutes):.1f}), "
            f"median server start {statistics.median([f['start'] for f in found]):g}"
        )
    print(line)
    footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
