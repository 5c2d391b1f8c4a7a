"""The hunt beside Schemathesis, the tool an API team reaches for: the same targets, the same minutes, the same
measure of vLLM's own lines each reached.

    .venv/bin/python bench/hunt_vs_schemathesis.py [--minutes 5] [--targets 0.30.0 0.32.0 0.32.0:dev]

Per target (a version; ``:dev`` adds VLLM_SERVER_DEV_MODE=1, which exposes the operator routes): Schemathesis (the
latest from PyPI, in a virtualenv of its own under .mmchaos/bench/, installed on first use) runs against a fresh
server on the routes the hunt sends (api_schema.ROUTES), all its phases (examples, coverage, fuzzing, stateful), one
worker, the ``not_a_server_error`` check, ``--max-time`` the minutes; then ``mmchaos hunt --engine`` runs the same
minutes (``--operator-actions`` with ``:dev``, no shrinking). Both servers measure vLLM's lines the same way (the
engines' coverage, harness/hunt/coverage.py: lines run after the server became healthy). Per tool: crashes and the
minutes to the first, routes answered 5xx, drift lines logged, vLLM lines by part. Schemathesis cannot restart a
server: its run ends at the first crash; the hunt restarts and searches on. Everything on 127.0.0.1, one server at a
time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import footer, header

from mmchaos import paths
from mmchaos.harness.hunt import api_schema
from mmchaos.harness.hunt.coverage import AREAS, EngineCoverage
from mmchaos.harness.servers.server import Server, Target
from mmchaos.signatures import Signatures

VENV = paths.home() / "bench" / "schemathesis"
ROUTES = "^(" + "|".join(re.escape(r) for r in api_schema.ROUTES) + ")$"  # the hunt's
ACCESS_5XX = re.compile(r'"POST (\S+) HTTP/1\.1" (5\d\d)')


def schemathesis() -> Path:
    exe = VENV / "bin" / "schemathesis"
    if not exe.exists():
        print(f"installing Schemathesis into {VENV} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "schemathesis"], check=True)
    return exe


def _from_log(log: Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    sigs = Signatures.load()
    matches = sigs.scan(text)
    return {
        "routes_5xx": sorted({m.group(1) for m in ACCESS_5XX.finditer(text)}),
        "drift_lines": sum(1 for m in matches if m.signature.drift),
        "crash": sigs.classify_crash(matches) if any(m.signature.fatal for m in matches) else None,
    }


def run_schemathesis(version: str, dev: bool, minutes: float, tmp: Path) -> dict:
    cov = EngineCoverage(tmp / "st-coverage")
    env = {**cov.env(), **({"VLLM_SERVER_DEV_MODE": "1"} if dev else {})}
    server = Server(Target(mode="engine", engine=version, env=env), tmp / "st-server.log")
    launched = time.time()
    server.start()
    try:
        server.wait_healthy(420)
        pids = [i.pid for i in server.processes().values()]
        cov.started(pids)
        t0 = time.time()
        # the same wall minutes as the hunt, whose --max-minutes count from its server's launch
        seconds = max(10, int(minutes * 60 - (t0 - launched)))
        st = subprocess.Popen(
            [str(schemathesis()), "run", f"{server.base_url}/openapi.json", "--checks", "not_a_server_error"]
            + ["--include-path-regex", ROUTES, "--workers", "1", "--max-time", str(seconds)]
            + ["--phases", "examples,coverage,fuzzing,stateful", "--suppress-health-check", "all"],
            stdout=open(tmp / "st.out", "w"),
            stderr=subprocess.STDOUT,
            cwd=tmp,  # its cache folder (.schemathesis/) goes there, not into the checkout
        )
        died = None
        while st.poll() is None and time.time() - t0 < minutes * 60 + 120:  # its own --max-time ends it
            if died is None and server.exit_code() is not None:
                died = time.time() - t0
            time.sleep(1)  # watching the server while Schemathesis runs
        if st.poll() is None:
            st.terminate()
            st.wait(timeout=30)
        if died is None and server.exit_code() is not None:
            died = time.time() - t0
        if server.exit_code() is None:
            cov.flush(pids)
        lines = cov.lines() - cov.startup
    finally:
        server.stop()
    got = _from_log(tmp / "st-server.log")
    return {
        "tool": "Schemathesis",
        "crashes": 1 if died is not None else 0,
        "first_crash_min": died / 60 if died is not None else None,
        **got,
        "lines": {area: sum(1 for f, _ in lines if f.startswith(p)) for area, p in AREAS.items()} | {"all": len(lines)},
        "by_file": _by_file(lines),
        "said": (tmp / "st.out").read_text(errors="replace").strip().splitlines()[-3:],
        "cases": next(
            (m.group(1) for m in re.finditer(r"(\d+) generated", (tmp / "st.out").read_text(errors="replace"))), "?"
        ),
    }


def run_hunt(version: str, dev: bool, minutes: float, tmp: Path) -> dict:
    out = tmp / "hunt"
    cmd = [sys.executable, "-m", "mmchaos.harness.cli", "hunt", "--engine", version, "--out", str(out)]
    cmd += ["--max-minutes", str(minutes), "--max-cases", "100000", "--max-starts", "50", "--no-minimize"]
    cmd += ["--operator-actions"] if dev else []
    subprocess.run(cmd, capture_output=True, text=True, timeout=minutes * 60 + 900)
    state = json.loads((out / "state.json").read_text())
    cases = [json.loads(x) for x in (out / "cases.jsonl").read_text().splitlines() if x.strip()]
    crashes = [c for c in cases if c.get("crash")]
    routes = sorted({f["route"] for f in state["findings"] if f["oracle"] == "server_error" and f.get("route")})
    areas = state.get("coverage", {}).get("areas", {})
    cov = EngineCoverage(out / "coverage")
    return {
        "tool": "mmchaos hunt",
        "crashes": len(crashes),
        "first_crash_min": crashes[0]["seconds"] / 60 if crashes else None,
        "routes_5xx": routes,
        "drift_lines": sum(1 for f in state["findings"] if f["oracle"] == "drift"),
        "crash": crashes[0]["crash"] if crashes else None,
        "lines": {a: v["by_cases"] for a, v in areas.items() if a != "all of vLLM"}
        | {"all": areas.get("all of vLLM", {}).get("by_cases", 0)},
        "findings": {
            o: sum(1 for f in state["findings"] if f["oracle"] == o) for o in {f["oracle"] for f in state["findings"]}
        },
        "cases": state["cases"],
        "by_file": _by_file(cov.lines() - cov.startup),
    }


def _by_file(lines: set[tuple[str, int]]) -> dict[str, int]:
    return dict(sorted(Counter(f for f, _ in lines).items()))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=5)
    p.add_argument("--targets", nargs="+", default=["0.30.0", "0.32.0", "0.32.0:dev"])
    p.add_argument(
        "--hunt-only",
        action="store_true",
        help="run the hunt alone (Schemathesis's figures are those of an earlier run; no ratio is printed)",
    )
    p.add_argument(
        "--keep",
        type=Path,
        help="keep each target's servers' logs and coverage data in this folder, and write the lines per vLLM file "
        "each tool reached (lines.json): where one tool reaches what the other does not",
    )
    a = p.parse_args()
    header(f"hunt vs Schemathesis: {a.minutes:g} min each, targets {' '.join(a.targets)}")
    for target in a.targets:
        version, _, mode = target.partition(":")
        with contextlib.ExitStack() as stack:
            if a.keep:
                tmp = a.keep / target.replace(":", "-")
                tmp.mkdir(parents=True, exist_ok=False)
            else:
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mmchaos-vs-st-")))
            rows = [] if a.hunt_only else [run_schemathesis(version, mode == "dev", a.minutes, tmp)]
            rows.append(run_hunt(version, mode == "dev", a.minutes, tmp))
            if a.keep:
                (tmp / "lines.json").write_text(json.dumps({r["tool"]: r["by_file"] for r in rows}, indent=1))
        print(f"\n{target}:")
        for r in rows:
            first = f"{r['first_crash_min']:.1f} min" if r["first_crash_min"] is not None else "-"
            print(
                f"  {r['tool']:13} {r.get('cases', '?')} cases; crashes {r['crashes']} (first at {first}, "
                f"{r['crash'] or 'none'}); 5xx routes "
                f"{', '.join(r['routes_5xx']) or 'none'}; drift {r['drift_lines']}; vLLM lines "
                + ", ".join(f"{k} {v}" for k, v in r["lines"].items())
            )
        if a.hunt_only:
            continue
        st, hunt = rows
        ratio = hunt["lines"]["all"] / st["lines"]["all"] if st["lines"]["all"] else float("inf")
        print(f"  lines ratio (hunt / Schemathesis): {ratio:.2f}; Schemathesis said: {' | '.join(st['said'])}")
    footer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
