"""The suite itself under faults (issue 8): every fault leaves valid, analysable results with one row per request
Locust counted, bad input fails in one line before anything is written, secrets stay out of every output file,
server text is escaped in reports, and no process the suite started outlives it.

Faults are injected from the campaign runner's own progress callback (called on every observation tick), using
the process groups the runner records in the trial's manifest as it starts them. Processes are only ever
signalled by those recorded ids. Everything runs against the stand-in on 127.0.0.1, bounded in time and count.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import campaign_toml
import pandas as pd
import psutil
import pyarrow.parquet as pq
import pytest
import requests as http
from cli_inprocess import mmchaos
from conftest import REPORT_VERSION, TESTS, require_engine_and_model, standin_server
from locust_run import ROOT, locust
from test_webui import wait_for

from mmchaos import schema
from mmchaos.analysis import report
from mmchaos.analysis.results import load_results
from mmchaos.harness import cli
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.options import WEIGHTS
from mmchaos.tables import read_table

PY = sys.executable
STANDIN = f"{PY} {TESTS / 'standin_server.py'}"
LOCUSTFILE = ROOT / "locustfiles" / "embeddings.py"
CAMP = "rel"
XSS = "<script>alert(1)</script><img src=x onerror=alert(2)>"


# --- helpers --------------------------------------------------------------------------------------------------


def write_campaign(
    tmp_path: Path,
    *,
    configs: list[dict] | None = None,
    command: str | None = None,
    target: str = "command",
    url: str = "",
    duration: float = 4,
    max_requests: int = 0,
    users: int = 3,
    trials: int = 1,
    policy: str = "stop",
    hang_after: float = 10,
    startup_timeout: float = 10,
    options: dict | None = None,
    mix: dict | None = None,
    locustfile: Path = LOCUSTFILE,
) -> Path:
    return campaign_toml.write_campaign(
        tmp_path,
        campaign={
            "name": CAMP,
            "trials": trials,
            "target": target,
            "command": f"{STANDIN} --port {{port}}" if command is None else command,
            "url": url,
        },
        workload={
            "locustfile": str(locustfile),
            "users": users,
            "spawn_rate": users,
            "duration": duration,
            "max_requests": max_requests,
        },
        options={"pool_size": 8, **(options or {})},
        mix=mix,
        crash={"policy": policy, "hang_after": hang_after, "startup_timeout": startup_timeout, "max_restarts": 1},
        configs=configs,
    )


def trial_dir(root: Path, config: str = "a", trial: int = 0) -> Path:
    return root / CAMP / config / schema.trial_folder(trial)


def manifest(trial: Path) -> dict:
    return json.loads((trial / schema.MANIFEST).read_text())


def recorded_pgids(trial: Path) -> set[int]:
    m = manifest(trial)
    return set(m.get("server_pgids", [])) | set(m.get("locust_pgids", []))


def live_in_groups(pgids: set[int]) -> list[int]:
    """Live (non-zombie) processes whose process group is one of ``pgids``."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.fixture
def reaper():
    """Groups a test started or learnt of; whatever of them a failing test left behind is killed at teardown
    (SIGCONT first: a stopped group must not stay stopped). Tests assert there is nothing to kill."""
    groups: set[int] = set()
    yield groups
    for pgid in groups:
        if live_in_groups({pgid}):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass


def assert_no_orphans(pgids: set[int], reaper: set[int]) -> None:
    reaper |= pgids
    assert pgids, "the runner recorded no process group"
    assert live_in_groups(pgids) == [], "processes started by the suite are still running"


class Fault:
    """The runner's progress callback, used to act once mid-load: when the trial being loaded has recorded at
    least ``after_rows`` rows, ``action(trial_folder)`` runs (in the runner's thread, between two observations)."""

    def __init__(self, root: Path, action, after_rows: int = 60):
        self.root, self.action, self.after_rows = root, action, after_rows
        self.at: float | None = None

    def __call__(self, state: dict) -> None:
        if self.at is None and state.get("phase") == "load" and state.get("requests", 0) >= self.after_rows:
            self.at = time.time()
            self.action(trial_dir(self.root, state["config"], state["trial"]))


def run(f: Path, root: Path, progress=None) -> list[campaign_runner.TrialResult]:
    return campaign_runner.CampaignRunner(campaign_plan.load(f), root, progress=progress).run()


def assert_counts_match(trial: Path) -> pd.DataFrame:
    """Every request Locust counted is exactly one recorded row, and the manifest says so too."""
    m = manifest(trial)
    rows = read_table(trial, "requests").to_pandas()
    assert m["locust_requests"] is not None, "Locust's own count (locust.json) is missing"
    assert len(rows) == m["requests"] > 0 and m["requests"] - m["cut"] == m["locust_requests"]
    assert m["cut"] == (rows["outcome"] == schema.CUT).sum()
    return rows


def assert_analysable(root: Path) -> str:
    """The campaign loads and `mmchaos report` builds; returns report.html."""
    c = load_results(root / CAMP)
    assert len(c.trials) >= 1
    assert cli.main(["report", str(root / CAMP), "-q"]) == 0
    return (root / CAMP / "report" / report.REPORT_HTML).read_text()


def server_port(trial: Path) -> int:
    """The port the stand-in said it listens on (its own first line in server.log)."""
    m = re.search(r"standin listening on 127\.0\.0\.1:(\d+)", (trial / schema.SERVER_LOG).read_text())
    return int(m.group(1))


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


# --- faults during a campaign ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_server_sigkill_mid_load_is_a_crash_and_the_restarted_server_takes_the_load(tmp_path, reaper):
    root = tmp_path / "results"
    # the kill comes with the first rows on disk (~1 s in); the restarted server then takes load until the budget
    # ends the trial, however busy the machine (the duration only bounds a hung trial)
    f = write_campaign(tmp_path, policy="restart", duration=120, max_requests=5000)
    killed = []

    def kill_server(trial):
        [pgid] = manifest(trial)["server_pgids"]
        reaper.add(pgid)
        killpg(pgid, signal.SIGKILL)
        killed.append(time.time())

    fault = Fault(root, kill_server)
    [res] = run(f, root, progress=fault)
    assert killed, "the fault never fired"
    trial = trial_dir(root)
    assert res.status == campaign_runner.COMPLETED and res.error is None
    [crash] = res.crashes
    assert crash.reason == "process_exit" and crash.exit_code == -signal.SIGKILL and crash.restart == 0
    # detected after the kill, before the restart (how soon: bench/detect_latency.py, not a time a busy machine
    # may miss)
    assert killed[0] <= crash.t_detected
    rows = assert_counts_match(trial)
    assert (rows["outcome"] == schema.CONNECTION_ERROR).any()  # refused while the server was down
    assert (rows.loc[rows["t_start"] > crash.t_detected, "outcome"] == schema.OK).any()  # the restart took load
    assert read_table(trial, "crashes").num_rows == 1
    assert len(manifest(trial)["server_pgids"]) == 2
    assert_no_orphans(recorded_pgids(trial), reaper)
    assert_analysable(root)


def _kill_and_take_port(squatter: socket.socket, reaper, trial: Path) -> None:
    """SIGKILL the trial's server and listen on its port with ``squatter`` (bound once the port is free)."""
    [pgid] = manifest(trial)["server_pgids"]
    reaper.add(pgid)
    port = server_port(trial)
    killpg(pgid, signal.SIGKILL)
    deadline = time.time() + 30  # only a process that never exits reaches it
    while True:  # the port is free once the killed process has finished exiting
        try:
            squatter.bind(("127.0.0.1", port))
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.02)
    squatter.listen()


@pytest.mark.integration
def test_a_port_held_for_a_moment_while_restarting_gets_one_more_try(tmp_path, reaper):
    root = tmp_path / "results"
    f = write_campaign(tmp_path, policy="restart", duration=120, max_requests=5000)  # ends at its budget
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    seen: list[str] = []

    kill_and_take_port = functools.partial(_kill_and_take_port, squatter, reaper)

    fault = Fault(root, kill_and_take_port)

    def progress(state: dict) -> None:
        fault(state)
        phase = state.get("phase", "")
        seen.append(phase)
        if phase.endswith("one more try"):  # the runner's first try failed on the held port: let it go
            squatter.close()

    try:
        [res] = run(f, root, progress=progress)
    finally:
        squatter.close()
    trial = trial_dir(root)
    assert any(p.startswith("restart failed (port ") for p in seen), seen[-20:]
    assert len(res.crashes) == 1 and not res.error, res.error
    assert len(manifest(trial)["server_pgids"]) == 2  # the second try's server took the load
    assert_no_orphans(recorded_pgids(trial), reaper)


@pytest.mark.integration
def test_port_taken_while_restarting_fails_the_restart_cleanly(tmp_path, reaper):
    root = tmp_path / "results"
    f = write_campaign(tmp_path, policy="restart", duration=120)  # the failed restart ends it; 120 s: a hang
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the dead server's TIME_WAITs do not count

    kill_and_take_port = functools.partial(_kill_and_take_port, squatter, reaper)

    try:
        [res] = run(f, root, progress=Fault(root, kill_and_take_port))
    finally:
        squatter.close()
    trial = trial_dir(root)
    assert len(res.crashes) == 1
    assert res.error.startswith("restart failed: port ") and "already in use" in res.error
    m = manifest(trial)
    assert m["status"] == campaign_runner.COMPLETED and m["error"] == res.error  # finished, not left "running"
    assert len(m["server_pgids"]) == 1  # the restart never launched anything
    assert_counts_match(trial)
    assert_no_orphans(recorded_pgids(trial), reaper)
    assert_analysable(root)


@pytest.mark.integration
def test_server_sigstop_hang_is_detected_after_hang_after_and_cleaned_up(tmp_path, reaper):
    root = tmp_path / "results"
    hang_after = 1.5
    # the detected hang ends the trial (policy stop): 120 s only bounds a hang of the runner's own
    f = write_campaign(tmp_path, duration=120, hang_after=hang_after, options={"request_timeout": 1.0})

    def stop_server(trial):
        [pgid] = manifest(trial)["server_pgids"]
        reaper.add(pgid)
        killpg(pgid, signal.SIGSTOP)

    fault = Fault(root, stop_server)
    [res] = run(f, root, progress=fault)
    trial = trial_dir(root)
    [crash] = res.crashes
    assert crash.reason == "hang" and crash.signature == "hang" and crash.exit_code is None
    # not before hang_after (how soon after it: the runner's tick, not a time a busy machine may miss)
    assert hang_after <= crash.t_detected - fault.at
    # the stopped server is continued to take its SIGTERM (SIGTERM alone would wait out the 15-s grace, then
    # SIGKILL it: no line)
    assert "standin: SIGTERM, shutting down" in (trial / schema.SERVER_LOG).read_text()
    rows = assert_counts_match(trial)
    assert (rows["outcome"] == schema.TIMEOUT).any()  # requests to the stopped server timed out, as rows
    crashes = read_table(trial, "crashes").to_pandas()
    assert list(crashes["signature"]) == ["hang"] and list(crashes["reason"]) == ["hang"]
    assert_no_orphans(recorded_pgids(trial), reaper)
    html = assert_analysable(root)
    assert "hang" in html


STALLING = """
import gevent.event
from locust import events
from mmchaos.locustfiles.embeddings import EmbeddingUser  # noqa: F401  (the realistic mix, as usual)

@events.test_stop.add_listener
def _never(**_):
    gevent.event.Event().wait()  # a client-side stall: Locust never ends its run
"""


@pytest.mark.integration
def test_a_locust_that_never_ends_is_stopped_with_its_greenlets_stacks_and_the_trial_says_so(
    tmp_path, reaper, monkeypatch
):
    monkeypatch.setattr(campaign_runner, "LOCUST_OVERRUN", 3.0)
    lf = tmp_path / "stalling.py"
    lf.write_text(STALLING)
    # its run time is what ends it (then it stalls): long enough for a loaded machine's Locust to start and send
    # (CI once recorded no request in 3 s, beside two vLLM lanes)
    f = write_campaign(tmp_path, duration=10, locustfile=lf)
    [res] = run(f, tmp_path / "results")
    trial = trial_dir(tmp_path / "results")
    m = manifest(trial)
    assert res.status == campaign_runner.INTERRUPTED and "did not end 3 s after its run time" in res.error
    assert m["status"] == "interrupted" and m["requests"] > 0  # its rows are kept
    log = (trial / schema.LOCUST_LOG).read_text()
    assert "greenlets on SIGUSR2" in log and "_never" in log  # where it stalled
    assert_no_orphans(set(m["locust_pgids"]) | set(m["server_pgids"]), reaper)


@pytest.mark.integration
def test_server_never_healthy_fails_its_trial_and_the_next_one_runs(tmp_path, reaper):
    root = tmp_path / "results"
    f = write_campaign(
        tmp_path,
        duration=60,  # "well" ends at its budget, however busy the machine
        max_requests=100,
        startup_timeout=1,
        configs=[{"name": "sick", "flags": ["--unhealthy"]}, {"name": "well"}],
    )
    sick, well = run(f, root)
    assert sick.status == campaign_runner.FAILED and well.status == campaign_runner.COMPLETED
    assert sick.error.startswith("server not healthy after 1 s at http://127.0.0.1:") and "\n" not in sick.error
    m = manifest(trial_dir(root, "sick"))
    assert m["status"] == campaign_runner.FAILED and m["error"] == sick.error and m["requests"] == 0
    assert_counts_match(trial_dir(root, "well"))
    assert_no_orphans(recorded_pgids(trial_dir(root, "sick")) | recorded_pgids(trial_dir(root, "well")), reaper)
    assert_analysable(root)


@pytest.mark.integration
def test_port_in_use_by_another_server_is_refused_not_loaded(tmp_path, reaper):
    """A command whose URL's port is taken: the /health of whatever answers there must not pass for ours."""
    root = tmp_path / "results"
    with standin_server(tmp_path / "occupant.log") as occupant:
        port = occupant.port
        f = write_campaign(
            tmp_path, trials=2, duration=2, command=f"{STANDIN} --port {port}", url=f"http://127.0.0.1:{port}"
        )
        results = run(f, root)
        metrics = http.get(occupant.base_url + "/metrics", timeout=5).text
    assert [r.status for r in results] == [campaign_runner.FAILED, campaign_runner.FAILED]  # the second trial still ran
    for r in results:
        assert f"port {port} of http://127.0.0.1:{port} is already in use" in r.error
    assert 'handler="/v1/embeddings"' not in metrics  # the occupant got no load
    for t in (0, 1):
        assert "server_pgids" not in manifest(trial_dir(root, trial=t))  # nothing was launched
    assert load_results(root / CAMP).trials["status"].tolist() == ["failed", "failed"]


@pytest.mark.integration
def test_locust_stopped_with_sigint_keeps_every_row_and_the_trial_is_interrupted(tmp_path, reaper):
    root = tmp_path / "results"
    f = write_campaign(tmp_path, duration=120)  # the SIGINT ends it (after 60 rows); 120 s: a hang

    def interrupt_locust(trial):
        [pgid] = manifest(trial)["locust_pgids"]
        reaper.add(pgid)
        killpg(pgid, signal.SIGINT)

    [res] = run(f, root, progress=Fault(root, interrupt_locust))
    trial = trial_dir(root)
    assert res.status == campaign_runner.INTERRUPTED  # a re-run will not skip it as done
    assert res.error.startswith("Locust ended after ")
    m = manifest(trial)
    assert m["locust_exit_code"] in (0, 1)  # Locust's own orderly shutdown (1: some requests failed)
    assert_counts_match(trial)
    assert not res.crashes
    assert_no_orphans(recorded_pgids(trial), reaper)
    assert_analysable(root)


@pytest.mark.integration
def test_ctrl_c_of_the_campaign_stops_everything_and_keeps_valid_results(tmp_path, reaper):
    """Ctrl-C reaches `mmchaos campaign run` (Locust and the server run in sessions of their own)."""
    root = tmp_path / "results"
    f = write_campaign(tmp_path, duration=120)  # the Ctrl-C ends it, once rows are recorded; 120 s: a hang
    cli = subprocess.Popen(
        [PY, "-m", "mmchaos.harness.cli", "campaign", "run", str(f), "--results", str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    reaper.add(cli.pid)
    trial = trial_dir(root)
    try:
        wait_for(lambda: list((trial / "requests").glob("part-*.parquet")), 60, "rows being recorded")
        reaper.update(recorded_pgids(trial))
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            killpg(cli.pid, signal.SIGKILL)
    assert cli.returncode == 130, out.decode()[-2000:]
    assert manifest(trial)["status"] == campaign_runner.INTERRUPTED
    assert_counts_match(trial)
    assert_no_orphans(recorded_pgids(trial), reaper)
    assert_analysable(root)


@pytest.mark.integration
def test_locust_sigkill_keeps_rows_up_to_the_last_second_and_the_trial_is_interrupted(tmp_path, reaper):
    root = tmp_path / "results"
    f = write_campaign(tmp_path, duration=120)  # the kill ends it (after 200 rows); 120 s: a hang

    killed = []

    def kill_locust(trial):
        [pgid] = manifest(trial)["locust_pgids"]
        reaper.add(pgid)
        killpg(pgid, signal.SIGKILL)
        killed.append(time.time())

    fault = Fault(root, kill_locust, after_rows=200)
    [res] = run(f, root, progress=fault)
    t_kill = killed[0]
    trial = trial_dir(root)
    assert res.status == campaign_runner.INTERRUPTED and not res.crashes  # not failed, not a server crash
    m = manifest(trial)
    assert m["locust_exit_code"] == -signal.SIGKILL
    assert m["locust_requests"] is None  # Locust died before writing its stats
    rows = read_table(trial, "requests").to_pandas()
    assert len(rows) == m["requests"] >= 200
    assert rows["t_start"].max() <= t_kill
    assert rows["t_start"].max() > t_kill - 2.5  # flushed every second: at most the last second is lost
    assert set(rows["outcome"]) <= set(schema.OUTCOMES)
    assert_no_orphans(recorded_pgids(trial), reaper)
    c = load_results(root / CAMP)
    assert c.trials["status"].tolist() == ["interrupted"] and len(c.requests) == len(rows)
    assert_analysable(root)


@pytest.mark.integration
def test_killed_worker_keeps_its_rows_and_the_run_goes_on(tmp_path, reaper):
    """Master + 2 workers (Locust's own distributed mode); one worker is SIGKILLed mid-run. The workers run in
    another folder and the results folder is relative to the master's: rows reach it only as messages."""
    rel = Path("results") / CAMP / "a" / "t000"  # the campaign layout, so the analysis reads it
    out = tmp_path / rel
    elsewhere = tmp_path / "elsewhere"  # the workers' working folder: "their disk"
    elsewhere.mkdir()
    counts = tmp_path / "worker-counts.json"
    with standin_server(tmp_path / "standin.log") as s, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        mport = sock.getsockname()[1]
        sock.close()
        lf = ["-f", str(TESTS / "locustfile_worker_counts.py")]
        env = {**os.environ, "MMCHAOS_TEST_WORKER_COUNTS": str(counts)}
        master = subprocess.Popen(
            [
                PY,
                "-m",
                "locust",
                *lf,
                "--master",
                "--master-bind-host",
                "127.0.0.1",
                "--master-bind-port",
                str(mport),
                "--expect-workers",
                "2",
                "--headless",
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "120s",  # only a hung run reaches it: the test stops the run once the survivor went on
                "--host",
                s.base_url,
                "--only-summary",
                "--json-file",
                str(out / "locust"),
                "--results-dir",
                str(rel),
                "--image-preset",
                "small",
                "--pool-size",
                "8",
                "--run-id",
                "w",
                "--config-name",
                "a",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )
        workers = [
            subprocess.Popen(
                [PY, "-m", "locust", *lf, "--worker", "--master-host", "127.0.0.1", "--master-port", str(mport)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                cwd=elsewhere,
                env=env,
                start_new_session=True,
            )
            for _ in range(2)
        ]
        reaper.update(p.pid for p in (master, *workers))
        victim, survivor = workers
        try:

            def parts_of(worker):
                return list((out / "requests").glob(f"part-*-{worker.pid}-*.parquet"))

            wait_for(lambda: len(parts_of(victim)) >= 2, 60, "the victim's rows of its own")
            killpg(victim.pid, signal.SIGKILL)
            t_kill = time.time()

            def went_on():  # the survivor's rows of requests started more than 2 s after the kill
                rows = read_table(out, "requests").to_pandas()
                return (
                    rows["worker"].astype(str).str.endswith(f"-{survivor.pid}") & (rows["t_start"] > t_kill + 2)
                ).any()

            wait_for(went_on, 60, "the survivor's rows after the kill")
            master.send_signal(signal.SIGTERM)  # the run's end, as the campaign runner ends one
            stdout, _ = master.communicate(timeout=60)
            survivor.wait(timeout=30)
        finally:
            for p in (master, *workers):
                if p.poll() is None:
                    killpg(p.pid, signal.SIGKILL)
    assert master.returncode in (0, 1), stdout[-2000:]
    on_worker_disk = sorted(p.name for p in (elsewhere / rel).iterdir()) if (elsewhere / rel).exists() else []
    assert on_worker_disk == [], "tables a worker wrote on its own disk: write them through plugin.table_writer"
    rows = read_table(out, "requests").to_pandas()
    assert not rows["request_id"].duplicated().any()  # parts sent again are written once
    by_pid = {int(w.rsplit("-", 1)[1]): g for w, g in rows.groupby("worker")}
    assert set(by_pid) == {victim.pid, survivor.pid}
    reported = {int(k): v for k, v in json.loads(counts.read_text()).items()}
    locust_total = sum(e["num_requests"] for e in json.loads((out / "locust.json").read_text()))
    assert locust_total == sum(reported.values())  # the master's count is the sum of what workers reported
    # the survivor: every request it made is one row (and those cut by the end of the run, which Locust does not
    # count), by Locust's count on the master (its last report included) and by the worker's own request events
    own = json.loads(Path(f"{counts}.{survivor.pid}").read_text())
    assert len(by_pid[survivor.pid][lambda d: d["outcome"] != schema.CUT]) == reported[survivor.pid] == own > 0
    # the master's ledger: the survivor handed over every part, the victim is lost
    ledger = json.loads((out / schema.WORKERS).read_text())
    tags = {int(w["worker"].rsplit("-", 1)[1]): w for w in ledger["workers"] if w["worker"]}
    assert tags[survivor.pid]["done"] and tags[survivor.pid]["rows"] == len(by_pid[survivor.pid])
    assert not tags[victim.pid]["done"] and ledger["lost"] == [tags[victim.pid]["worker"]]
    # the run went on without the victim
    assert by_pid[survivor.pid]["t_start"].max() > t_kill + 2
    # the victim: its rows up to its death are kept (flushed each second), nothing after it
    dead = by_pid[victim.pid]
    assert len(dead) > 0 and dead["t_start"].max() <= t_kill and dead["t_start"].max() > t_kill - 2.5
    assert (dead.groupby("user_id")["seq"].apply(lambda s: sorted(s) == list(range(1, len(s) + 1)))).all()
    c = load_results(tmp_path / "results" / CAMP)
    assert len(c.requests) == len(rows)
    assert_no_orphans({p.pid for p in (master, *workers)} | {s.pgid}, reaper)


# --- bad input ------------------------------------------------------------------------------------------------


def _bad_image_dir(tmp_path: Path) -> str:
    d = tmp_path / "imgs"
    d.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 32), (200, 10, 10)).save(d / "good.png")
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    return str(d)


def _line_of(text: str, word: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if word in line)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD_INPUT = {
    # case: (how the campaign file is changed, needles that must all be in the one line)
    "malformed toml": (lambda tmp, text: text.replace("[workload]", "[workload"), ["not valid TOML"]),
    "unknown key": (
        lambda tmp, text: text.replace("users = 3", "usres = 3"),
        [lambda text: f":{_line_of(text, 'usres')}: unknown key 'usres' in [workload]", "did you mean 'users'?"],
    ),
    "unknown section": (
        lambda tmp, text: text + '\n[crashes]\npolicy = "stop"\n',
        [lambda text: f":{_line_of(text, '[crashes]')}: unknown section [crashes]", "did you mean 'crash'?"],
    ),
    "wrong type": (lambda tmp, text: text.replace("trials = 1", 'trials = "one"'), ["'trials' must be int"]),
    "version not a version": (
        lambda tmp, text: text.replace('target = "command"', 'target = "engine"').replace(
            'name = "a"', 'name = "a"\nengine = "latest"'
        ),
        ["'latest' is not a vLLM version", "e.g. 0.30.0"],
    ),
    "version unknown": (
        lambda tmp, text: text.replace('target = "command"', 'target = "engine"').replace(
            'name = "a"', 'name = "a"\nengine = "9.9.9"'
        ),
        ["vLLM 9.9.9 is not installed", "mmchaos engine install 9.9.9"],
    ),
    "missing image dir": (
        lambda tmp, text: text.replace("pool_size = 8", f'image_dir = "{tmp}/no-such-dir"'),
        ["image_dir: image directory", "no-such-dir' does not exist", "point image_dir at a folder of readable images"],
    ),
    "unreadable image": (
        lambda tmp, text: text.replace("pool_size = 8", f'image_dir = "{_bad_image_dir(tmp)}"'),
        ["broken.png' cannot be decoded", "point image_dir at a folder of readable images"],
    ),
    "unreachable attach url": (
        lambda tmp, text: text.replace('target = "command"', 'target = "attach"').replace(
            'url = ""', f'url = "http://127.0.0.1:{_closed_port()}"'
        ),
        ["/health did not answer 200 (ConnectionError)", "start the server or fix url in"],
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_line_naming_problem_and_fix_and_writes_nothing(tmp_path, case):
    edit, needles = BAD_INPUT[case]
    f = write_campaign(tmp_path)
    text = edit(tmp_path, f.read_text())
    f.write_text(text)
    results = tmp_path / "results"
    # in this process: refused before anything runs
    r = mmchaos("campaign", "run", str(f), "--results", str(results), env={"MMCHAOS_HOME": str(tmp_path / "home")})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mmchaos: ")
    for needle in needles:
        assert (needle(text) if callable(needle) else needle) in lines[0]
    assert not results.exists()  # nothing half-written


def test_non_writable_results_folder_is_one_line_and_writes_nothing(tmp_path):
    f = write_campaign(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    r = mmchaos("campaign", "run", str(f), "--results", str(blocker / "results"))
    assert r.returncode == 2, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert f"results folder {blocker}/results/{CAMP} is not writable (Not a directory)" in line
    assert "pick another with --results" in line
    assert blocker.read_text() == "not a folder\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "a-file",
        "campaign.toml",
    ]


@pytest.mark.integration
def test_plain_locust_with_a_bad_image_dir_fails_with_its_reason(standin, tmp_path):
    """Outside campaigns (which check image_dir up front), Locust itself says why and exits non-zero."""
    missing = tmp_path / "no-such-dir"
    r = locust("locustfiles/embeddings.py", standin.base_url, tmp_path, "--image-dir", str(missing), seconds=3)
    assert r.returncode == 2, r.stdout[-2000:]
    assert f"mmchaos: image directory '{missing}' does not exist" in r.stdout
    assert "Traceback" not in r.stdout
    assert read_table(tmp_path, "requests").num_rows == 0


# --- secrets --------------------------------------------------------------------------------------------------


def _text_of_parquet(p: Path) -> str:
    return json.dumps(pq.read_table(p).to_pylist(), default=str)


@pytest.mark.integration
@pytest.mark.parametrize("via", ["env", "file"])
def test_api_key_is_sent_as_bearer_and_never_written_anywhere(tmp_path, via, reaper, monkeypatch):
    key = f"sk-mmchaos-{uuid.uuid4().hex}"
    # the stand-in, given the key by its environment (as vLLM takes VLLM_API_KEY), refuses requests without it
    monkeypatch.setenv("STANDIN_API_KEY", key)
    with standin_server(tmp_path / "check.log") as s:
        body = {"model": "standin", "input": "x"}
        assert http.post(s.base_url + "/v1/embeddings", json=body, timeout=5).status_code == 401
        assert (
            http.post(
                s.base_url + "/v1/embeddings", json=body, timeout=5, headers={"Authorization": f"Bearer {key}"}
            ).status_code
            == 200
        )

    root = tmp_path / "results"
    # ends at its budget, however busy the machine (the duration only bounds a hung trial)
    f = write_campaign(tmp_path, duration=120, max_requests=200, configs=[{"name": "keyed"}])
    env = {**os.environ, "STANDIN_API_KEY": key}  # the server's own configuration; Server passes it on
    env.pop("MMCHAOS_API_KEY", None)
    env.pop("MMCHAOS_API_KEY_FILE", None)
    if via == "env":
        env["MMCHAOS_API_KEY"] = key
    else:
        keyfile = tmp_path / "secrets" / "api.key"
        keyfile.parent.mkdir()
        keyfile.write_text(key + "\n")
        env["MMCHAOS_API_KEY_FILE"] = str(keyfile)
    run_out = subprocess.run(
        [PY, "-m", "mmchaos.harness.cli", "campaign", "run", str(f), "--results", str(root)],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    trial = trial_dir(root, "keyed")
    reaper.update(recorded_pgids(trial))
    assert run_out.returncode == 0, run_out.stderr.decode()[-2000:]
    rows = assert_counts_match(trial)
    posts = rows[rows["endpoint"].isin(["/v1/embeddings", "/tokenize"])]
    # the bearer was sent: no 401, and answers
    assert (posts["status"] != 401).all() and (posts["outcome"] == schema.OK).any()
    rep = subprocess.run(
        [PY, "-m", "mmchaos.harness.cli", "report", str(root / CAMP)],
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert rep.returncode == 0, rep.stderr.decode()[-2000:]

    needle = key.encode()
    outputs = [p for p in root.rglob("*") if p.is_file()]
    assert {
        schema.MANIFEST,
        schema.SERVER_LOG,
        "locust.log",
        "locust.json",
        "campaign.json",
        "report.html",
        "report.md",
    } <= {p.name for p in outputs}
    assert any(p.suffix == ".parquet" for p in outputs)
    for p in outputs:
        assert needle not in p.read_bytes(), p
        if p.suffix == ".parquet":
            assert key not in _text_of_parquet(p), p
    for stream in (run_out.stdout, run_out.stderr, rep.stdout, rep.stderr):
        assert needle not in stream
    assert_no_orphans(recorded_pgids(trial), reaper)


# --- reports --------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_report_renders_server_text_as_text(tmp_path, reaper):
    """A server error message and server log lines carrying HTML end up in report.html escaped."""
    root = tmp_path / "results"
    # the server dies at its 301st embedding request, ending the trial (policy stop) however busy the machine;
    # ~5 % of requests are a dimensions case, answered with the error text: none of 300, p < 1e-6
    f = write_campaign(
        tmp_path,
        duration=120,
        max_requests=2000,
        configs=[{"name": "xss", "flags": ["--error-text", XSS, "--die-after", "300"]}],
    )
    [res] = run(f, root)
    trial = trial_dir(root, "xss")
    reaper.update(recorded_pgids(trial))
    assert res.crashes, "the stand-in was meant to crash (so its log tail is in the report)"
    rows = read_table(trial, "requests").to_pandas()
    assert (rows["error"] == XSS).any()  # recorded as received
    assert XSS in (trial / schema.SERVER_LOG).read_text()
    html = assert_analysable(root)
    assert "<script" not in html.lower() and "<img src=x" not in html.lower()
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;"
    assert html.count(escaped) >= 2  # the error-text table and the server.log tail at least
    md = (root / CAMP / "report" / report.REPORT_MD).read_text()
    outside_code = re.sub(r"(`{3,})text\n.*?\n\1", "", md, flags=re.S)
    assert "<script" not in outside_code.lower()  # Markdown passes raw HTML through; code blocks do not
    assert_no_orphans(recorded_pgids(trial), reaper)


# --- real engine ----------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_real_vllm_hang_is_detected_and_its_whole_stopped_group_cleaned_up(tmp_path, reaper):
    """vLLM is a process group (API server, EngineCore) with SIGTERM handlers: stopped, none of it would handle
    SIGTERM. The stand-in is one process, so this is proven on the real engine."""
    require_engine_and_model(REPORT_VERSION)
    root = tmp_path / "results"
    # valid traffic only: the chaos mix would crash this version (the report's bug) before the hang is injected
    mix = {k: int(k in ("valid_image", "text")) for k in WEIGHTS}
    f = write_campaign(
        tmp_path,
        target="engine",
        duration=40,
        hang_after=3,
        startup_timeout=420,
        mix=mix,
        options={"request_timeout": 2.0},
        configs=[{"name": "a", "engine": REPORT_VERSION}],
    )
    group: list[int] = []

    def stop_server(trial):
        [pgid] = manifest(trial)["server_pgids"]
        reaper.add(pgid)
        group.extend(live_in_groups({pgid}))
        killpg(pgid, signal.SIGSTOP)

    fault = Fault(root, stop_server, after_rows=20)
    [res] = run(f, root, progress=fault)
    trial = trial_dir(root)
    assert fault.at, f"the server went down before the hang was injected: {res.crashes}"
    assert len(group) >= 2, "expected vLLM's API server and its EngineCore"
    [crash] = res.crashes
    assert crash.signature == "hang" and crash.t_detected - fault.at >= 3  # no sooner than hang_after
    # continued after its SIGTERM, the stopped server shut down in order (SIGTERM alone would wait out the grace,
    # then SIGKILL: no shutdown line)
    assert "Application shutdown complete" in (trial / "server.log").read_text(errors="replace")
    assert_counts_match(trial)
    assert_no_orphans(recorded_pgids(trial), reaper)
    assert_analysable(root)
