"""Load-generator efficiency: how many requests per second one Locust process of mmchaos sends, next to a bare
FastHttpUser posting the same bodies and next to wrk, all against a null endpoint (nginx answering 200).

    .venv/bin/python bench/loadgen.py [--quick] [--users 16] [--seconds 20] [--reps 3]

nginx (Debian's nginx-light or nginx) is configured in a temp folder to listen on 127.0.0.1:<free port> and to
answer every request with 200 and a tiny embedding body; the script starts it and stops it by its pid. Then, in
turn, ``--reps`` times each (interleaved, so a burst of load from other users of the machine hits all three
alike), for the same duration and the same number of users / connections:

- mmchaos: ``locustfiles/embeddings.py``, the realistic mix (default options: realistic images up to 2048 px,
  10 % never-repeated images, aborts, malformed cases...), recording every request to Parquet, /health and
  /metrics watchers on;
- bare: a FastHttpUser posting bodies of that same mix, pre-built before the run (``bench/locust_bare.py``);
- wrk: ``wrk -t1`` posting the same pre-built bodies (a C client: what the endpoint and loopback can take).

Rates are Locust's own (its --json-file: requests / (last request - first start)) and wrk's. Goals (the median
over the interleaved pairs): mmchaos >= 0.5x the bare FastHttpUser rate with the default mix, >= 0.8x with
``--set fresh_fraction=0``; with ``--processes 2``, mmchaos on two processes >= 1.7x one process.
"""

from __future__ import annotations

import argparse
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    ROOT,
    counted_rows,
    footer,
    header,
    load,
    nginx_null,
    rate_arguments,
    ratio_line,
    run_locust,
    stop_group,
)

GOAL, GOAL_NO_FRESH = 0.5, 0.8  # of the bare rate: with the default mix / without never-repeated images
PROCESS_EFFICIENCY = 0.85  # --processes N on N cores: at least 0.85 N times one process (1.7x for 2)
WRK_LUA = """
local bodies, paths, n, idx = {}, {}, 0, 0
for line in io.lines("%s") do
  local path, file = line:match("^(%%S+) (.+)$")
  local f = io.open(file, "rb"); local b = f:read("*a"); f:close()
  n = n + 1; paths[n] = path; bodies[n] = b
end
local headers = {["Content-Type"] = "application/json"}
request = function()
  idx = idx %% n + 1
  return wrk.format("POST", paths[idx], headers, bodies[idx])
end
"""


def build_bodies(n: int, users: int, overrides: dict) -> list[tuple[str, bytes]]:
    """``n`` requests of the realistic mix, as the first ``users`` users of a run would build them."""
    import argparse as ap

    from mmchaos import options
    from mmchaos.locustfiles.plugin.traffic import Traffic, UserTraffic

    o = ap.Namespace(**{x.name: x.default for x in options.OPTIONS})
    o.model = "bench"
    for k, v in overrides.items():
        setattr(o, k, options.BY_NAME[k].type(v))
    traffic = Traffic(o)  # also warms the on-disk image cache for the Locust runs
    streams = [UserTraffic(traffic, o.seed, 0, u, o.model) for u in range(users)]
    out = []
    for i in range(n):
        s = streams[i % users]
        req = s.build(s.next_kind())
        out.append((req.path, req.payload()))
    return out


def run_wrk(url: str, users: int, seconds: int, lua: Path) -> dict:
    exe = shutil.which("wrk")
    if not exe:
        return {"rate": float("nan"), "requests": 0, "error": "wrk not installed (apt-get install -y wrk)"}
    proc = subprocess.Popen(
        [exe, "-t1", f"-c{users}", f"-d{seconds}s", "--timeout", "10s", "-s", str(lua), url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=seconds + 30)
    finally:
        stop_group(proc, 10.0)
    m = re.search(r"Requests/sec:\s*([\d.]+)", out or "")
    n = re.search(r"(\d+) requests in", out or "")
    return {
        "rate": float(m.group(1)) if m else float("nan"),
        "requests": int(n.group(1)) if n else 0,
        "error": None if m else (out or "")[-300:],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rate_arguments(p)
    p.add_argument("--bodies", type=int, default=400, help="pre-built bodies for bare and wrk")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="a mix option for mmchaos and the pre-built bodies alike, e.g. fresh_fraction=0",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=0,
        help="also run mmchaos on Locust's --processes N (N workers forked by a master) in each rep",
    )
    a = p.parse_args()
    overrides = dict(x.split("=", 1) for x in a.set)
    if a.quick:
        a.seconds, a.reps = 6, 1
    header("bench/loadgen.py: load-generator efficiency against a null endpoint")
    t = time.perf_counter()
    if overrides:
        print(f"mix options: {overrides}")
    bodies = build_bodies(a.bodies, a.users, overrides)
    sizes = [len(b) for _, b in bodies]
    print(
        f"pre-built {len(bodies)} bodies of the realistic mix in {time.perf_counter() - t:.1f} s: mean "
        f"{statistics.mean(sizes) / 1e3:.0f} kB, max {max(sizes) / 1e6:.2f} MB",
        flush=True,
    )

    rows = []
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-loadgen-") as tmp:
        tmp = Path(tmp)
        with open(tmp / "bodies.pkl", "wb") as f:
            pickle.dump(bodies, f)
        (tmp / "bodies").mkdir()
        lines = []
        for i, (path, body) in enumerate(bodies):
            (tmp / "bodies" / f"{i}.json").write_bytes(body)
            lines.append(f"{path} {tmp / 'bodies' / f'{i}.json'}")
        (tmp / "manifest.txt").write_text("\n".join(lines) + "\n")
        (tmp / "wrk.lua").write_text(WRK_LUA % (tmp / "manifest.txt"))
        del bodies

        with nginx_null() as url:
            print(
                f"null endpoint: nginx at {url}; {a.users} users / connections, {a.seconds} s per run, "
                f"{a.reps} interleaved rep(s)",
                flush=True,
            )
            for rep in range(a.reps):
                res = tmp / f"mm{rep}"
                mm = run_locust(
                    ROOT / "locustfiles/embeddings.py",
                    url,
                    a.users,
                    a.seconds,
                    res,
                    [
                        "--model",
                        "bench",
                        "--results-dir",
                        str(res / "rows"),
                        "--run-id",
                        f"bench{rep}",
                        *[x for k, v in overrides.items() for x in ("--" + k.replace("_", "-"), v)],
                    ],
                )
                mm["rows"] = counted_rows(res / "rows")
                mm["load"] = load()
                if a.processes:
                    res_n = tmp / f"mmN{rep}"
                    mm["multi"] = run_locust(
                        ROOT / "locustfiles/embeddings.py",
                        url,
                        a.users,
                        a.seconds,
                        res_n,
                        [
                            "--model",
                            "bench",
                            "--results-dir",
                            str(res_n / "rows"),
                            "--run-id",
                            f"benchN{rep}",
                            "--processes",
                            str(a.processes),
                            *[x for k, v in overrides.items() for x in ("--" + k.replace("_", "-"), v)],
                        ],
                    )
                    mm["multi"]["rows"] = counted_rows(res_n / "rows")
                    print(
                        f"rep {rep}: mmchaos --processes {a.processes} {mm['multi']['rate']:8.1f} req/s "
                        f"({mm['multi']['requests']} requests, {mm['multi']['rows']} rows)",
                        flush=True,
                    )
                bare = run_locust(
                    Path(__file__).with_name("locust_bare.py"),
                    url,
                    a.users,
                    a.seconds,
                    tmp / f"bare{rep}",
                    env={"MMCHAOS_BENCH_BODIES": str(tmp / "bodies.pkl")},
                )
                bare["load"] = load()
                wrk = run_wrk(url, a.users, a.seconds, tmp / "wrk.lua")
                wrk["load"] = load()
                rows.append((mm, bare, wrk))
                print(
                    f"rep {rep}: mmchaos {mm['rate']:8.1f} req/s ({mm['requests']} requests, {mm['rows']} rows, "
                    f"load {mm['load']})  bare {bare['rate']:8.1f} req/s (load {bare['load']})  "
                    f"wrk {wrk['rate']:8.1f} req/s (load {wrk['load']})  mmchaos/bare "
                    f"{mm['rate'] / bare['rate']:.3f}",
                    flush=True,
                )
                if "main_us" in mm and "main_us" in bare:
                    print(
                        f"  CPU per request: mmchaos main thread {mm['main_us']:.0f} us + other threads "
                        f"{mm['other_us']:.0f} us (encodes); bare main thread {bare['main_us']:.0f} us",
                        flush=True,
                    )
                if wrk.get("error"):
                    print(f"  wrk: {wrk['error']}")
                if mm["rows"] != mm["requests"]:
                    print(f"  WARNING: {mm['requests']} requests in Locust's count but {mm['rows']} rows recorded")

    ratios = [mm["rate"] / bare["rate"] for mm, bare, _ in rows]
    med = statistics.median(ratios)
    mm_rate = statistics.median(r[0]["rate"] for r in rows)
    bare_rate = statistics.median(r[1]["rate"] for r in rows)
    wrk_rate = statistics.median(r[2]["rate"] for r in rows)
    print()
    print(f"median rates (req/s): mmchaos {mm_rate:.1f}, bare FastHttpUser {bare_rate:.1f}, wrk -t1 {wrk_rate:.1f}")
    print(f"bare / wrk = {bare_rate / wrk_rate:.3f}   mmchaos / wrk = {mm_rate / wrk_rate:.3f}")
    print(f"mmchaos / bare per rep: {', '.join(f'{r:.3f}' for r in ratios)}")
    cpu = [(mm["main_us"], bare["main_us"]) for mm, bare, _ in rows if "main_us" in mm and "main_us" in bare]
    if cpu:
        print(
            f"main-thread CPU per request, bare / mmchaos (median): "
            f"{statistics.median(b / m for m, b in cpu):.3f} (the rate ratio a saturated core allows)"
        )
    goal = GOAL_NO_FRESH if float(overrides.get("fresh_fraction", 1)) == 0 else GOAL
    print(ratio_line("mmchaos / bare FastHttpUser rate", med, goal, "x", higher_is_better=True))
    lost = sum(mm["requests"] - mm["rows"] for mm, _, _ in rows)
    scaled = True
    if a.processes:
        lost += sum(mm["multi"]["requests"] - mm["multi"]["rows"] for mm, _, _ in rows)
        gain = statistics.median(mm["multi"]["rate"] / mm["rate"] for mm, _, _ in rows)
        want = PROCESS_EFFICIENCY * a.processes
        print(ratio_line(f"--processes {a.processes} / one process", gain, want, "x", higher_is_better=True))
        scaled = gain >= want
    print(f"every request a row: {'yes' if lost == 0 else f'NO ({lost} requests without a row)'}")
    footer()
    return 0 if med >= goal and lost == 0 and scaled else 1


if __name__ == "__main__":
    sys.exit(main())
