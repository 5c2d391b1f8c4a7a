"""Server-side faults without vLLM: the [[fault]] table as `campaign check` reads it, the processes found by role,
the fault proxy's network faults on real sockets, and faults injected into a stand-in server's process tree."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import campaign_toml
import pandas as pd
import psutil
import pytest
from conftest import standin_server

from mmchaos import faults, schema
from mmchaos.analysis.fault_effects import fault_effects
from mmchaos.analysis.results import load_results
from mmchaos.analysis.sections_faults import in_words
from mmchaos.analysis.verdict import verdicts
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.harness.injection.proxy import FaultProxy
from mmchaos.harness.servers.server_processes import alive, identify
from mmchaos.tables import read_table


def _campaign(
    tmp_path: Path,
    fault: str,
    *,
    flags: tuple[str, ...] = ("--tensor-parallel-size", "2"),
    target: str = "command",
    duration: int = 30,
    policy: str | None = "restart",
    max_requests: int | None = None,
    env: dict | None = None,
) -> Path:
    """A campaign of one configuration (``tp2``) and ``fault``: its ``[[fault]]`` tables as a user writes them."""
    where = {} if target == "command" else {"command": None, "url": "http://127.0.0.1:9"}
    return campaign_toml.write_campaign(
        tmp_path / "f.toml",
        campaign={"name": "faults", "target": target, **where},
        workload={"users": 2, "spawn_rate": 2, "duration": duration, "max_requests": max_requests},
        options={"pool_size": 8},
        crash={"policy": policy},
        configs=[{"name": "tp2", "flags": list(flags), **({"env": env} if env else {})}],
        faults=tomllib.loads(fault)["fault"],
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    "fault, needle",
    [
        ('[[fault]]\nkind = "kill"\ntarget = "tp_worker"\nat = 5\n', None),
        ('[[fault]]\nkind = "explode"\nat = 5\n', "kind 'explode' is not a fault"),
        ('[[fault]]\nkind = "kill"\ntarget = "gpu"\nat = 5\n', "target = one of tp_worker, engine_core, api_server"),
        ('[[fault]]\nkind = "kill"\ntarget = "tp_worker"\n', "say when"),
        ('[[fault]]\nkind = "kill"\ntarget = "tp_worker"\nat = 60\n', "not within the load's 30 s"),
        ('[[fault]]\nkind = "stop"\ntarget = "tp_worker"\nat = 5\n', "a stop lasts: give duration"),
        ('[[fault]]\nkind = "kill"\ntarget = "tp_worker"\nrank = 2\nat = 5\n', "has TP ranks 0-1, not 2"),
        ('[[fault]]\nkind = "kill"\ntarget = "api_server"\nrank = 1\nat = 5\n', "runs 1 API server(s)"),
        ('[[fault]]\nkind = "latency"\nat = 5\nduration = 2\n', "a latency needs latency_ms"),
        ('[[fault]]\nkind = "reset"\nat = 5\nduration = 2\nlatency_ms = 5\n', "reset takes no 'latency_ms'"),
        ('[[fault]]\nkind = "kill"\ntarget = "tp_worker"\nat = 5\nafter_requests = 3\n', "not both"),
        ('[[fault]]\nkind = "pause"\nat = 5\nduration = 2\n', 'env = { VLLM_SERVER_DEV_MODE = "1" }'),
        ('[[fault]]\nkind = "pause"\nat = 5\n', "a pause lasts: give duration"),
        ('[[fault]]\nkind = "pause"\nmode = "drop"\nat = 5\nduration = 2\n', "mode must be one of abort, wait"),
        ('[[fault]]\nkind = "sleep"\nlevel = 3\nat = 5\nduration = 2\n', "level must be one of 0, 1, 2"),
        ('[[fault]]\nkind = "reset_mm_cache"\nat = 5\nduration = 2\n', "a reset_mm_cache is at once"),
        ('[[fault]]\nkind = "reset_mm_cache"\ntarget = "tp_worker"\nat = 5\n', 'target = "server" or none'),
    ],
)
def test_fault_tables_are_checked_in_one_line(tmp_path, fault, needle):
    f = _campaign(tmp_path, fault)
    r = subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "campaign", "check", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if needle is None:
        assert r.returncode == 0, r.stderr
        return
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0] and str(f) in lines[0], r.stderr


@pytest.mark.integration
@pytest.mark.parametrize(
    "target, needle",
    [
        ("command", "has TP rank 0 only (tensor parallel size 1), not 1: it has no tp_worker:1"),
        ("attach", "an attached server's processes are not mmchaos's to signal"),
    ],
)
def test_a_fault_on_a_process_the_server_does_not_have_is_refused(tmp_path, target, needle):
    f = _campaign(
        tmp_path, '[[fault]]\nkind = "kill"\ntarget = "tp_worker"\nrank = 1\nat = 5\n', flags=(), target=target
    )
    r = subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "campaign", "check", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_fault_table_defaults_the_crash_policy_to_restart(tmp_path):
    kill = '[[fault]]\nkind = "kill"\ntarget = "engine_core"\nat = 5\n'
    plan = campaign_plan.load(_campaign(tmp_path, kill, policy="restart"))
    assert plan.faults[0].role() == "engine_core" and plan.faults[0].name == "kill engine_core at 5 s"
    assert campaign_plan.load(_campaign(tmp_path, kill, policy=None)).crash.policy == "restart"


@pytest.mark.integration
def test_processes_are_found_by_role_in_our_group_only(tmp_path):
    with standin_server(tmp_path / "s.log", "--tensor-parallel-size", "2") as server:
        found = identify(server.pgid, server.proc.pid)
        assert sorted(found) == ["api_server:0", "engine_core", "tp_worker:0", "tp_worker:1"]
        core = psutil.Process(found["engine_core"].pid)
        assert found["api_server:0"].pid == server.proc.pid and core.ppid() == server.proc.pid
        assert {found[f"tp_worker:{r}"].pid for r in (0, 1)} == {c.pid for c in core.children()}
        # a process titled as vLLM's outside our group is not ours
        other = subprocess.Popen(["VLLM::Worker_TP7", "100"], executable="/bin/sleep", start_new_session=True)
        try:
            assert "tp_worker:7" not in identify(server.pgid, server.proc.pid)
        finally:
            other.kill()
            other.wait()
        worker = found["tp_worker:1"]
        psutil.Process(worker.pid).kill()
        psutil.Process(worker.pid).wait(10)
        assert not alive(worker)
    with standin_server(tmp_path / "s1.log", "--tensor-parallel-size", "1") as server:  # CPU's TP=1: one "Worker"
        assert sorted(identify(server.pgid, server.proc.pid)) == ["api_server:0", "engine_core", "tp_worker:0"]


# -- the fault proxy ---------------------------------------------------------------------------------------------
class _Upstream:
    """A loopback server answering each request line with ``size`` bytes; records when each answer was written."""

    def __init__(self, size: int):
        self.size = size
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.written: list[float] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # a send buffer smaller than the answer
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        with c:
            try:
                while c.recv(1 << 16):
                    c.sendall(b"x" * self.size)
                    self.written.append(time.monotonic())
            except OSError:
                return


def _ask(port: int, timeout: float = 20, want: int = 1) -> tuple[bytes, float]:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET\n")
        got = b""
        while len(got) < want:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            got += chunk
    return got, time.monotonic() - t0


@pytest.fixture
def proxied():
    up = _Upstream(200_000)
    proxy = FaultProxy("127.0.0.1", up.port).start()
    yield up, proxy
    proxy.stop()
    up.sock.close()


def test_the_proxy_listens_on_loopback_and_passes_bytes_unchanged(proxied):
    _, proxy = proxied
    assert proxy.host == "127.0.0.1" and proxy.url == f"http://127.0.0.1:{proxy.port}"
    got, _ = _ask(proxy.port, want=200_000)
    assert got == b"x" * 200_000


def test_latency_and_bandwidth_slow_each_answer(proxied):
    _, proxy = proxied
    proxy.switch_on("l", faults.LATENCY, {"latency_ms": 400, "jitter_ms": 0})
    got, took = _ask(proxy.port, want=200_000)
    assert got == b"x" * 200_000 and took >= 0.4
    proxy.switch_off("l")
    proxy.switch_on("b", faults.BANDWIDTH, {"kbps": 100})
    got, took = _ask(proxy.port, want=200_000)
    assert got == b"x" * 200_000 and took >= 1.5  # 200 kB at 100 kB/s: about 2 s, never less than the cap allows


def test_reset_after_n_bytes_resets_the_client(proxied):
    _, proxy = proxied
    proxy.switch_on("r", faults.RESET, {"after_bytes": 1000})
    got = b""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=20) as s:
        s.sendall(b"GET\n")
        with pytest.raises(ConnectionResetError):
            while True:
                chunk = s.recv(1 << 16)
                assert chunk, "closed with FIN, not reset"
                got += chunk
    assert len(got) == 1000 and proxy.counts["resets"] == 1


def test_silence_accepts_and_never_answers_until_it_ends(proxied):
    up, proxy = proxied
    proxy.switch_on("s", faults.SILENCE, {})
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=20) as s:
        s.sendall(b"GET\n")
        s.settimeout(1.0)
        with pytest.raises(TimeoutError):
            s.recv(1)  # connected (accepted), and nothing comes back
        assert up.written == []  # the request never reached the server
        proxy.switch_off("s")
        s.settimeout(20)
        try:  # when the silence ends the connection it held is closed (reset: its request was never read)
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass
    assert _ask(proxy.port, want=200_000)[0] == b"x" * 200_000  # and new ones are served again


def test_a_slow_reader_holds_the_servers_writes_back(proxied):
    up, proxy = proxied
    up.size = 2_000_000  # more than the kernel's socket buffers hold
    proxy.switch_on("w", faults.SLOW_READ, {"kbps": 400})
    t0 = time.monotonic()
    got, _ = _ask(proxy.port, want=2_000_000)
    assert got == b"x" * 2_000_000
    # the server's sendall could only finish as the proxy read: 2 MB at 400 kB/s less the buffers' worth
    assert up.written and up.written[0] - t0 >= 2.0


# -- faults injected into the stand-in's process tree ------------------------------------------------------------
@pytest.mark.integration
def test_kill_of_a_tp_worker_is_a_row_a_crash_and_a_restart(tmp_path):
    fault = (
        '[[fault]]\nkind = "kill"\ntarget = "tp_worker"\nrank = 1\nafter_requests = 20\n\n'
        '[[fault]]\nkind = "kill"\ntarget = "engine_core"\nafter_requests = 100000\n'
    )
    # the stand-in answers in 20 ms: the run ends at its 400th request (a minute bounds it), well after the restart
    f = _campaign(
        tmp_path,
        fault,
        duration=60,
        max_requests=400,
        flags=("--tensor-parallel-size", "2", "--delay-ms", "20"),
    )
    [result] = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    trial = tmp_path / "results" / "faults" / "tp2" / "t000"
    rows = read_table(trial, "faults").to_pandas().set_index("fault")
    manifest = json.loads((trial / schema.MANIFEST).read_text())
    first = {p["role"]: p["pid"] for p in manifest["processes"] if p["restart"] == 0}
    kill = rows.loc["kill tp_worker:1 after 20 requests"]
    assert kill["outcome"] == schema.FAULT_INJECTED and kill["target_pid"] == first["tp_worker:1"]
    assert result.crashes and result.crashes[0].signature == "worker_died"
    assert {p["restart"] for p in manifest["processes"]} >= {0, 1}  # the restarted server's processes recorded too
    assert rows.loc["kill engine_core after 100000 requests", "outcome"] == schema.FAULT_NOT_REACHED

    # what the report says followed it: the server exited (the crash the watcher saw), came back, served again
    c = load_results(tmp_path / "results" / "faults")
    e = fault_effects(c).set_index("fault")
    k = e.loc["kill tp_worker:1 after 20 requests"]
    assert k["exited_after_s"] == pytest.approx(result.crashes[0].t_detected - kill["t_injected"])
    assert "worker_died" in k["exit"] and k["served_again_after_s"] > k["exited_after_s"]
    assert k["verdict"] == "recovers" and k["health_200_without_service_s"] < 30
    assert e.loc["kill engine_core after 100000 requests", "verdict"] == "not_injected"
    v = verdicts(c, fault_effects(c)).iloc[0]
    assert v["faults"] == "recovers" and v["stays_up"] == "ok"  # the crash the kill caused is the fault's, not a bug


def test_a_faults_effects_end_where_the_next_fault_begins(tmp_path):
    """Bodiless 2xx answers after a reset began are the reset's, even while an earlier latency fault is still
    switched on (a real 0.32.0 run: the reset's empty answers failed the latency fault)."""
    from test_analysis import T0, health, req, write_trial

    camp = tmp_path / "faults"
    ok = [req(t) | {"response_bytes": 500, "request_group": f"g{t}"} for t in range(1, 20)]
    empty = [req(t + 0.5) | {"response_bytes": 0, "request_group": f"e{t}"} for t in (13, 14)]
    folder = write_trial(
        camp, "c", 0, manifest={"t_start": T0, "t_end": T0 + 20}, health=health(range(0, 20)), requests=ok + empty
    )
    rows = [
        {
            "fault": "latency",
            "kind": "latency",
            "target": "network",
            "t_injected": T0 + 10,
            "t_cleared": T0 + 15,
            "outcome": schema.FAULT_INJECTED,
        },
        {
            "fault": "reset",
            "kind": "reset",
            "target": "network",
            "t_injected": T0 + 12,
            "t_cleared": T0 + 17,
            "outcome": schema.FAULT_INJECTED,
        },
    ]
    d = folder / "faults"
    d.mkdir()
    import pyarrow.parquet as pq

    pq.write_table(schema.table_from_rows(rows, schema.TABLES["faults"]), d / "part-test-000000.parquet")
    e = fault_effects(load_results(camp)).set_index("fault")
    assert e.loc["latency", "verdict"] == "recovers" and e.loc["latency", "empty_2xx"] == 0, e.loc["latency"]
    assert e.loc["reset", "verdict"] == "fails" and e.loc["reset", "empty_2xx"] == 2, e.loc["reset"]


DEV = {"VLLM_SERVER_DEV_MODE": "1"}


@pytest.mark.integration
def test_operator_actions_are_sent_under_load_and_judged_by_the_bounds_given(tmp_path):
    """A keep-pause holds every request while /health answers 200 (the stand-in's wedge on demand): the row says
    what the server answered to the action and to its undo, the report says it in words, and the gates fail it
    only when asked with a bound it exceeds. A cache reset is at once."""
    from cli_inprocess import mmchaos

    fault = (
        '[[fault]]\nkind = "reset_mm_cache"\nafter_requests = 10\n\n'
        '[[fault]]\nkind = "pause"\nmode = "keep"\nafter_requests = 30\nduration = 4\n'
    )
    # the stand-in answers in 20 ms: the run ends at its 120th request (a minute bounds it), after the pause
    f = _campaign(tmp_path, fault, duration=60, max_requests=120, flags=("--delay-ms", "20"), env=DEV)
    assert subprocess.run([sys.executable, "-m", "mmchaos.harness.cli", "campaign", "check", str(f)]).returncode == 0
    [result] = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    trial = tmp_path / "results" / "faults" / "tp2" / "t000"
    rows = read_table(trial, "faults").to_pandas().set_index("kind")
    assert (rows["outcome"] == schema.FAULT_INJECTED).all(), rows[["outcome", "detail"]]
    assert rows.loc["pause", "target"] == "server" and pd.isna(rows.loc["pause", "target_pid"])
    assert "POST /pause?mode=keep: 200" in rows.loc["pause", "detail"]
    assert "POST /resume: 200" in rows.loc["pause", "detail"]
    assert rows.loc["pause", "t_cleared"] - rows.loc["pause", "t_injected"] >= 4
    # in effect once answered (vLLM pauses, then answers): never before it was sent
    assert (rows["t_effect"] >= rows["t_injected"]).all(), rows[["t_injected", "t_effect"]]
    assert "POST /reset_mm_cache: 200" in rows.loc["reset_mm_cache", "detail"]
    assert pd.isna(rows.loc["reset_mm_cache", "t_cleared"])
    log = (trial / schema.SERVER_LOG).read_text()
    assert log.index("operator: POST /pause?mode=keep") < log.index("operator: POST /resume")
    assert not result.crashes

    e = fault_effects(load_results(tmp_path / "results" / "faults")).set_index("kind")
    pause = e.loc["pause"]
    assert pause["health_200_without_service_s"] >= 4 and pause["verdict"] == "recovers"  # < 30 s: no wedge
    words = in_words(next(e.reset_index().query("kind == 'pause'").itertuples()))
    assert "/health answered 200 without service for" in words and "served again after" in words

    out = tmp_path / "report"
    plain = mmchaos("report", str(tmp_path / "results" / "faults"), "--out", str(out), "-q")
    assert plain.returncode == 0, plain.stderr
    assert "pause mode=keep for 4 s after 30 requests:" in (out / "report.md").read_text()
    wedge = mmchaos("report", str(tmp_path / "results" / "faults"), "--out", str(out), "-q", "--max-wedge-s", "2")
    assert wedge.returncode == 1 and "fault failed" in wedge.stderr and "wedged" in wedge.stderr, wedge.stderr
    slow = mmchaos("report", str(tmp_path / "results" / "faults"), "--out", str(out), "-q", "--max-recovery-s", "1")
    assert slow.returncode == 1 and "served again only" in slow.stderr, slow.stderr
    loose = mmchaos(
        "report",
        str(tmp_path / "results" / "faults"),
        "--out",
        str(out),
        "-q",
        "--max-wedge-s",
        "60",
        "--max-recovery-s",
        "60",
    )
    assert loose.returncode == 0 and "no fault wedged" in loose.stderr, loose.stderr


@pytest.mark.integration
def test_a_campaign_with_its_web_ui_lists_scheduled_faults_and_takes_faults_by_hand(tmp_path):
    """`campaign run --web-port`: the trial's Locust serves its web UI; the panel lists the scheduled fault with its
    outcome, a fault fired through the web UI's relay lands in the same trial's faults table (source web_ui)."""
    import os
    import signal

    import requests

    from mmchaos.harness.servers.processes import free_port

    f = _campaign(
        tmp_path,
        '[[fault]]\nkind = "reset_mm_cache"\nafter_requests = 5\n',
        duration=40,
        max_requests=100000,
        flags=("--delay-ms", "20"),
        env=DEV,
    )
    port = free_port()
    log = open(tmp_path / "run.out", "w")
    cli = subprocess.Popen(
        [sys.executable, "-m", "mmchaos.harness.cli", "campaign", "run", str(f), "--results", str(tmp_path / "r")]
        + ["--web-port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ui = f"http://127.0.0.1:{port}"
    try:

        def scheduled_listed():
            try:
                rows = requests.get(ui + "/mmchaos/state", timeout=2).json()["faults"]
            except (requests.RequestException, ValueError, KeyError):
                return None
            return [r for r in rows if r["source"] == "campaign" and r["outcome"] == "injected"] or None

        deadline = time.time() + 300  # bounds the loop only: it ends with the campaign
        while not scheduled_listed():
            assert cli.poll() is None and time.time() < deadline, (tmp_path / "run.out").read_text()
            time.sleep(0.2)  # polling the web UI
        r = requests.post(ui + "/mmchaos/faults/fire", json={"kind": "reset_prefix_cache"}, timeout=10)
        assert r.status_code == 200 and r.json()["source"] == "web_ui", r.text
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGINT)  # as Ctrl-C: the trial stops, its rows kept
        cli.wait(timeout=120)
        log.close()
    rows = read_table(tmp_path / "r" / "faults" / "tp2" / "t000", "faults").to_pandas().set_index("kind")
    assert rows.loc["reset_mm_cache", "source"] == "campaign"
    assert rows.loc["reset_prefix_cache", "source"] == "web_ui"
    assert rows.loc["reset_prefix_cache", "outcome"] == schema.FAULT_INJECTED
