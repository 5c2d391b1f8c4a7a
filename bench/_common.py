"""Helpers shared by the bench scripts: the machine line, a null HTTP endpoint (nginx), Locust runs, and
stopping only what we started (by the pid / process group we recorded at launch, never by name)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil

from mmchaos.harness.servers.processes import free_port, stop_group

ROOT = Path(__file__).resolve().parent.parent

PY = sys.executable
NULL_BODY = '{"data":[{"embedding":[0.1]}]}'


def load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def rate_arguments(p) -> None:
    """The options of a benchmark of Locust's rate at full speed (bench/loadgen.py, bench/trace_cost.py)."""
    p.add_argument("--quick", action="store_true", help="one 6 s run of each (a smoke run)")
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--reps", type=int, default=3)


def header(name: str) -> None:
    print(
        f"# {name}  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  cores {os.cpu_count()}  load average {load()} "
        f"(1/5/15 min)",
        flush=True,
    )


def footer() -> None:
    print(f"# load average at the end {load()}", flush=True)


NGINX_CONF = """
worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    client_max_body_size 0;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    server {{
        listen 127.0.0.1:{port} reuseport;
        location / {{
            default_type application/json;
            return 200 '{body}';
        }}
    }}
}}
"""


@contextmanager
def nginx_null():
    """nginx (Debian's) answering 200 and a tiny embedding body to everything on 127.0.0.1:<free port>.
    Yields the base URL. Stopped by the pid recorded at launch (its own process group)."""
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(exe):
        raise SystemExit("nginx is not installed: apt-get install -y nginx-light")
    d = Path(tempfile.mkdtemp(prefix="mmchaos-bench-nginx-"))
    port = free_port()
    (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, port=port, body=NULL_BODY))
    proc = subprocess.Popen(
        [exe, "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError as e:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"nginx did not start: {(d / 'error.log').read_text()[-500:]}") from e
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc, 10.0, leader_first=True, sig=signal.SIGQUIT)  # graceful: the master stops its worker
        shutil.rmtree(d, ignore_errors=True)


def locust_stats(json_base: Path) -> dict:
    """Requests, failures and the rate Locust itself measured (its --json-file): requests / (last request -
    first start)."""
    entries = json.loads(Path(str(json_base) + ".json").read_text())
    n = sum(e["num_requests"] for e in entries)
    fails = sum(e["num_failures"] for e in entries)
    t0 = min((e["start_time"] for e in entries), default=0)
    t1 = max((e["last_request_timestamp"] or 0 for e in entries), default=0)
    span = max(t1 - t0, 1e-9)
    return {"requests": n, "failures": fails, "span_s": span, "rate": n / span}


def start_locust(
    locustfile: Path,
    host: str,
    users: int,
    seconds: int,
    out: Path,
    extra: list[str] = (),
    env: dict | None = None,
    cwd: Path = ROOT,
) -> subprocess.Popen:
    """Start one headless Locust process (its own process group), bounded by -t, writing its log and its
    --json-file into ``out``; stop it with stop_group."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        PY,
        "-m",
        "locust",
        "-f",
        str(locustfile),
        "--headless",
        "--only-summary",
        "-u",
        str(users),
        "-r",
        str(users),
        "-t",
        f"{seconds}s",
        "--stop-timeout",
        "2",
        "--host",
        host,
        "--loglevel",
        "WARNING",
        "--json-file",
        str(out / "locust"),
        *extra,
    ]
    with open(out / "locust.log", "wb") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )


def _thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of the process's main thread and of its other threads together: the process's total less
    the main thread's (a sum over live threads drops the share of threads that ended, and could go down)."""
    proc = psutil.Process(pid)
    main = sum(t.user_time + t.system_time for t in proc.threads() if t.id == pid)
    total = proc.cpu_times()
    return main, total.user + total.system - main


def run_locust(
    locustfile: Path,
    host: str,
    users: int,
    seconds: int,
    out: Path,
    extra: list[str] = (),
    env: dict | None = None,
    timeout: float | None = None,
    cwd: Path = ROOT,
) -> dict:
    """One headless Locust process to its end; returns locust_stats, and the CPU per request of its main thread
    and of its other threads (µs, from ~3 s in, after start-up, to its last second: psutil's thread times)."""
    proc = start_locust(locustfile, host, users, seconds, out, extra, env, cwd)
    marks = []  # (time, main CPU s, other CPU s) while it runs
    try:
        deadline = time.time() + (timeout or seconds + 60)
        while proc.poll() is None and time.time() < deadline:
            with suppress(psutil.Error):
                marks.append((time.time(), *_thread_cpu(proc.pid)))
            time.sleep(0.5)
    finally:
        stop_group(proc, 10.0)
    try:
        stats = locust_stats(out / "locust")
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"Locust left no stats ({e}); its log:\n{(out / 'locust.log').read_text()[-2000:]}") from e
    warm = [m for m in marks if m[0] >= marks[0][0] + 3] if marks else []
    if len(warm) >= 2:
        (t0, main0, other0), (t1, main1, other1) = warm[0], warm[-1]
        n = stats["rate"] * (t1 - t0)
        stats.update(main_us=1e6 * (main1 - main0) / n, other_us=1e6 * (other1 - other0) / n)
    return stats


def counted_rows(folder: Path) -> int:
    """Rows of the requests Locust counted (not those cut by the end of the run, which Locust never counts)."""
    from mmchaos import schema
    from mmchaos.tables import read_table

    return sum(o != schema.CUT for o in read_table(folder, "requests").column("outcome").to_pylist())


def ratio_line(name: str, value: float, goal: float, unit: str = "", higher_is_better: bool = False) -> str:
    """'name value unit  goal G  ratio R  PASS|MISS' (ratio = value / goal)."""
    ok = value >= goal if higher_is_better else value <= goal
    cmp = ">=" if higher_is_better else "<="
    return (
        f"{name:34s} {value:10.3f} {unit:6s} goal {cmp} {goal:g} {unit}  ratio to goal {value / goal:6.2f}  "
        f"{'PASS' if ok else 'MISS'}"
    )


# --- campaigns ------------------------------------------------------------------------------------------------


def campaign_toml(
    folder: Path,
    name: str,
    *,
    configs: list[dict],
    trials: int = 1,
    target: str = "engine",
    command: str = "",
    users: int = 8,
    duration: int = 30,
    locustfile: Path | None = None,
    options: dict | None = None,
    policy: str = "stop",
    seed: int = 1,
    hang_after: int = 10,
) -> Path:
    """Write a campaign file into ``folder`` (a temp dir) and return its path. ``configs``: dicts with name,
    and engine / flags as in a campaign file."""

    def val(v):
        return json.dumps(v)

    lines = ["[campaign]", f"name = {val(name)}", f"trials = {trials}", f"target = {val(target)}", f"seed = {seed}"]
    if command:
        lines.append(f"command = {val(command)}")
    lines += [
        "",
        "[workload]",
        f"locustfile = {val(str(locustfile or ROOT / 'locustfiles/embeddings.py'))}",
        f"users = {users}",
        f"spawn_rate = {users}",
        f"duration = {duration}",
        "",
        "[workload.options]",
    ]
    lines += [f"{k} = {val(v)}" for k, v in (options or {}).items()]
    lines += ["", "[crash]", f"policy = {val(policy)}", f"hang_after = {hang_after}", "startup_timeout = 300"]
    for c in configs:
        lines += ["", "[[config]]"] + [f"{k} = {val(v)}" for k, v in c.items()]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def phase_printer(prefix: str = "  "):
    """A CampaignRunner progress callback that prints each phase once (not every load tick)."""
    last = {}

    def show(state: dict) -> None:
        phase = state.get("phase", "").split(" (")[0]
        key = (state.get("config"), state.get("trial"), phase)
        if key != last.get("k"):
            last["k"] = key
            print(
                f"{prefix}[{time.strftime('%H:%M:%S')}] {state.get('config')} t{state.get('trial')}: {phase}",
                flush=True,
            )

    return show


def trial_facts(folder: Path) -> dict:
    """What a finished trial folder says: manifest, first crash, request rows (a DataFrame)."""
    from mmchaos.tables import read_table

    manifest = json.loads((folder / "manifest.json").read_text())
    crashes = read_table(folder, "crashes").to_pandas()
    requests = read_table(folder, "requests").to_pandas().sort_values("t_start", ignore_index=True)
    first = crashes.sort_values("t_detected").iloc[0] if len(crashes) else None
    return {"manifest": manifest, "crashes": crashes, "first_crash": first, "requests": requests}
