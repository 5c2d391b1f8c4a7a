"""Campaigns on Locust's master and workers, every worker's rows on the master (issue 16): local worker processes
and a worker of `mmchaos worker` under one campaign master, one worker SIGKILLed mid-trial, a crash policy's stop
and Ctrl-C reaching every worker, and a master started again taking the rows its workers send again.

Everything runs against the stand-in on 127.0.0.1, bounded in time; processes are stopped only by the group ids
recorded when they were started (the runner's manifest, or the test's own Popen)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import campaign_toml
import psutil
import pytest
from conftest import TESTS, standin_server
from helpers import wait_until as wait_for
from locust_run import ROOT

# the suite's process bookkeeping, one definition (reaper is a fixture: pytest finds it in this module)
from test_reliability import CAMP, Fault, assert_no_orphans, killpg, live_in_groups, manifest, reaper  # noqa: F401

from mmchaos import schema
from mmchaos.analysis.results import load_results
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.harness.campaign.distributed import Distribution
from mmchaos.harness.campaign.plan import CampaignError
from mmchaos.harness.servers.processes import free_port
from mmchaos.tables import compact, encode_part, part_problem, put_part, read_table

PY = sys.executable
COUNTING = TESTS / "locustfile_worker_counts.py"  # the mix, plus each worker's own counts (see its docstring)


def write_campaign(
    tmp_path: Path,
    *,
    processes: int,
    expect_workers: int = 0,
    port: int = 5557,
    duration: int = 30,
    server_flags: str = "",
    policy: str = "stop",
) -> Path:
    return campaign_toml.write_campaign(
        tmp_path,
        campaign={"name": CAMP, "command": f"{campaign_toml.STANDIN} {server_flags}".strip()},
        workload={
            "locustfile": str(COUNTING),
            "users": 6,
            "spawn_rate": 6,
            "duration": duration,
            "processes": processes,
            "expect_workers": expect_workers,
            "master_bind_port": port,
            "expect_workers_max_wait": 60,
        },
        options={"pool_size": 8},
        crash={"policy": policy},
    )


def pid_of(worker_tag: str) -> int:
    return int(worker_tag.rsplit("-", 1)[1])


def per_worker(rows) -> dict[int, object]:
    return {pid_of(w): g for w, g in rows.groupby("worker")}


def contiguous(rows) -> bool:
    """Each user's requests are 1, 2, 3, ... without a gap: none missing up to the last one kept."""
    return bool(rows.groupby("user_id")["seq"].apply(lambda s: sorted(s) == list(range(1, len(s) + 1))).all())


# --- fast checks ----------------------------------------------------------------------------------------------


def test_a_part_written_twice_is_one_part_also_after_compaction(tmp_path):
    folder = tmp_path / schema.TABLE_DIRS["health"]
    data = encode_part(schema.table_from_rows([{"t": 1.0, "ok": True, "status": 200}], schema.HEALTH))
    assert put_part(folder, "part-w-000000.parquet", data) is True
    assert put_part(folder, "part-w-000000.parquet", data) is False
    assert put_part(folder, "part-w-000001.parquet", data) is True
    assert compact(folder) == 2
    assert put_part(folder, "part-w-000001.parquet", data) is False  # held by the compacted file
    assert len(read_table(tmp_path, "health")) == 2
    for bad in ("../part-x.parquet", "part-x.parquet/../../y", "x.parquet", ".part-x.parquet.tmp"):
        with pytest.raises(ValueError):
            put_part(folder, bad, data)
    assert part_problem(data, schema.HEALTH) is None
    assert "not the table's" in part_problem(data, schema.REQUESTS)
    assert "not a Parquet file" in part_problem(b"junk", schema.HEALTH)


# The master's end, on a real Locust master runner, in a process of its own (importing Locust patches the
# process it is imported in): parts offered as a worker (or anyone reaching the port) would.
MASTER_END = r"""
import json, sys
from locust.env import Environment
from locust.rpc.protocol import Message
from mmchaos import schema
from mmchaos.locustfiles.plugin import shipping
from mmchaos.tables import encode_part

folder, port = sys.argv[1], int(sys.argv[2])
env = Environment()
env.create_master_runner("127.0.0.1", port)
inbox = shipping.Inbox(env)
inbox.open_run("R", folder)
good = encode_part(schema.table_from_rows([{"request_id": "r1", "kind": "text"}], schema.REQUESTS))
health = encode_part(schema.table_from_rows([{"t": 1.0}], schema.HEALTH))
offers = [{}, {}, {"run": "other"}, {"table": "../../x"}, {"table": "nope"}, {"name": "../part-x.parquet"},
          {"name": "part-y.parquet/../../z.parquet"}, {"data": b"not parquet"}, {"data": health}, {"data": "text"},
          {"name": "part-w-000001.parquet"}]
for offer in offers:
    data = {"run": "R", "table": "requests", "name": "part-w-000000.parquet", "rows": 1, "worker": "h-1",
            "data": good, **offer}
    inbox._on_part(env, Message(shipping.PART, data, "client-1"))
inbox._on_done(env, Message(shipping.DONE, {"run": "R", "worker": "h-1", "spilled": 0}, "client-1"))
env.runner.quit()
print(json.dumps([vars(r) for r in inbox.ledgers["R"].values()]))
"""


@pytest.mark.integration
def test_the_master_writes_each_part_once_and_nothing_that_is_not_a_part_of_its_run(tmp_path):
    folder = tmp_path / "run"
    p = subprocess.run(
        [PY, "-c", MASTER_END, str(folder), str(free_port())], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr[-2000:]
    written = sorted(str(f.relative_to(tmp_path)) for f in tmp_path.rglob("*") if f.is_file())
    assert written == ["run/requests/part-w-000000.parquet", "run/requests/part-w-000001.parquet", "run/workers.json"]
    [rec] = json.loads(p.stdout.splitlines()[-1])
    assert (rec["parts"], rec["rows"], rec["done"], rec["worker"]) == (2, 2, True, "h-1")  # the resend counted once
    assert json.loads((folder / schema.WORKERS).read_text())["lost"] == []


def test_the_master_and_its_workers_are_decided_by_the_workload(tmp_path):
    plan = campaign_plan.load(write_campaign(tmp_path, processes=0))
    assert Distribution.of(plan.workload) is None  # one Locust process, as before
    plan = campaign_plan.load(write_campaign(tmp_path, processes=2))
    local = Distribution.of(plan.workload)
    # only workers of this machine: loopback and a free port, whatever the file says
    assert (local.bind_host, local.processes, local.remote) == ("127.0.0.1", 2, 0) and local.port != 5557
    assert local.master_args()[:3] == ["--master", "--expect-workers", "2"]
    argv = local.local_workers_argv(plan.workload.locustfile)
    assert argv[argv.index("--processes") + 1] == "2" and argv[argv.index("--master-port") + 1] == str(local.port)
    plan = campaign_plan.load(write_campaign(tmp_path, processes=1, expect_workers=3, port=6000))
    both = Distribution.of(plan.workload)
    assert both.master_args()[:3] == ["--master", "--expect-workers", "4"] and both.port == 6000


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("processes", "-1", "processes must be 0 to 1024"),
        ("expect_workers", "2000", "expect_workers must be 0 to 1024"),
        ("master_bind_port", "70000", "master_bind_port must be a port"),
        ("master_bind_host", '"a b"', "master_bind_host 'a b' must be an address"),
        ("expect_workers_max_wait", "0", "expect_workers_max_wait must be at least 1 s"),
    ],
)
def test_bad_worker_keys_are_one_line_naming_the_key(tmp_path, key, value, says):
    f = write_campaign(tmp_path, processes=1)
    f.write_text(_set_key(f.read_text(), key, value))
    with pytest.raises(CampaignError) as e:
        campaign_plan.load(f)
    assert says in str(e.value) and len(str(e.value).splitlines()) == 1 and str(f) in str(e.value)


def _set_key(text: str, key: str, value: str) -> str:
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} = ")]
    at = lines.index("[workload]") + 1
    return "\n".join([*lines[:at], f"{key} = {value}", *lines[at:]]) + "\n"


# --- campaigns ------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_campaign_on_local_and_remote_workers_a_killed_worker_is_recorded_and_a_crash_stops_them_all(
    tmp_path, reaper, monkeypatch
):
    """A campaign master with 2 local worker processes and one `mmchaos worker` (as on another machine); one local
    worker is SIGKILLed mid-trial; the server then dies and the crash policy `stop` ends the trial."""
    counts = tmp_path / "counts.json"
    monkeypatch.setenv("MMCHAOS_TEST_WORKER_COUNTS", str(counts))
    port = free_port()
    root = tmp_path / "results"
    die = tmp_path / "die"  # the server dies when the test creates it (--die-on-file): after the kill, not at a time
    f = write_campaign(
        tmp_path, processes=2, expect_workers=1, port=port, duration=120, server_flags=f"--die-on-file {die}"
    )
    remote = subprocess.Popen(
        [
            PY,
            "-m",
            "mmchaos.harness.cli",
            "worker",
            "--master-host",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--locustfile",
            str(COUNTING),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    reaper.add(remote.pid)
    killed = []

    def kill_a_local_worker(trial):
        pgids = manifest(trial)["locust_pgids"]
        reaper.update(pgids)
        local_group = pgids[1]  # [master, this machine's workers]
        children = [p for p in live_in_groups({local_group}) if p != local_group]  # Locust forked them
        # a worker that has handed rows over already (one killed before its first flush is known by Locust's id)
        victim = wait_for(
            lambda: next(
                (
                    p
                    for p in children
                    if p
                    in per_worker(  # parts come each second
                        read_table(trial, "requests").to_pandas()
                    )
                ),
                None,
            ),
            "a local worker's first rows",
            running=lambda: any(p in children for p in live_in_groups({local_group})),
        )
        killed.append(victim)
        os.kill(victim, signal.SIGKILL)

    kill = Fault(root, kill_a_local_worker, after_rows=150)
    rows_at_kill: list[int] = []

    def progress(state):
        kill(state)
        # once the load went on without the victim (100 rows more), the server is told to die: one crash, which
        # ends the trial (policy stop)
        if kill.at is None or state.get("phase") != "load":
            return
        rows_at_kill[:] = rows_at_kill or [state["requests"]]
        if state["requests"] >= rows_at_kill[0] + 100 and len(rows_at_kill) == 1:
            rows_at_kill.append(state["requests"])
            die.touch()

    try:
        [res] = campaign_runner.CampaignRunner(campaign_plan.load(f), root, progress=progress).run()
        trial = root / CAMP / "a" / "t000"
        m = manifest(trial)
        # the remote worker's Locust quit with the master; `mmchaos worker` waits for the next master's run
        remote_lost = [c.pid for c in psutil.Process(remote.pid).children()]
        remote.send_signal(signal.SIGINT)
        out, _ = remote.communicate(timeout=60)
    finally:
        if remote.poll() is None:
            killpg(remote.pid, signal.SIGKILL)
    [victim] = killed
    assert res.status == campaign_runner.COMPLETED and len(res.crashes) == 1  # stopped by the crash policy
    assert remote.returncode == 0 and "joining the master" in out, out[-2000:]
    # the killed worker is recorded, and the trial says so
    lost = m["workers_lost"]
    assert [pid_of(w) for w in lost] == [victim] and len(m["workers"]) == 3
    assert "1 Locust worker lost mid-trial" in res.error and "1 Locust worker lost mid-trial" in m["error"]
    assert any("lost mid-trial" in w for w in load_results(root / CAMP).warnings)  # the report's notes
    # rows: one per request of each worker, all on the master
    rows = read_table(trial, "requests").to_pandas()
    assert not rows["request_id"].duplicated().any()
    by_pid = per_worker(rows)
    reported = {int(k): v for k, v in json.loads(counts.read_text()).items()}
    assert set(by_pid) == set(reported) and len(by_pid) == 3 and victim in by_pid
    for pid, g in by_pid.items():
        if pid != victim:  # Locust's count on the master, the worker's last report included
            assert len(g[g["outcome"] != schema.CUT]) == reported[pid] > 0, pid
    assert contiguous(by_pid[victim]) and m["locust_requests"] == sum(reported.values())
    # nothing of the trial is left running; the remote worker's Locust ended with its master
    assert_no_orphans(set(m["server_pgids"]) | set(m["locust_pgids"]), reaper)
    assert not [p for p in remote_lost if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


@pytest.mark.integration
def test_ctrl_c_of_a_campaign_with_workers_stops_them_and_keeps_every_row(tmp_path, reaper):
    root = tmp_path / "results"
    f = write_campaign(tmp_path, processes=2, duration=120)  # the Ctrl-C ends it, once both workers' rows are in
    cli = subprocess.Popen(
        [PY, "-m", "mmchaos.harness.cli", "campaign", "run", str(f), "--results", str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    reaper.add(cli.pid)
    trial = root / CAMP / "a" / "t000"
    try:
        wait_for(
            lambda: len({p.name.split("-")[2] for p in (trial / "requests").glob("part-*.parquet")}) >= 2,
            "rows of both local workers",
            running=lambda: cli.poll() is None,  # the campaign's 120 s of load end it
        )
        reaper.update(manifest(trial)["locust_pgids"] + manifest(trial)["server_pgids"])
        cli.send_signal(signal.SIGINT)
        out, _ = cli.communicate(timeout=90)
    finally:
        if cli.poll() is None:
            killpg(cli.pid, signal.SIGKILL)
    assert cli.returncode == 130, out.decode()[-2000:]
    m = manifest(trial)
    assert m["status"] == campaign_runner.INTERRUPTED, (m.get("error"), out.decode()[-2000:])
    assert m["workers_lost"] == [] and len(m["workers"]) == 2
    rows = read_table(trial, "requests").to_pandas()
    # every request is a row; Locust (whose count includes each worker's last report) counts all but the cut
    assert len(rows) == m["requests"] > 0 and m["requests"] - m["cut"] == m["locust_requests"]
    assert rows["worker"].nunique() == 2 and not rows["request_id"].duplicated().any()
    assert_no_orphans(set(m["server_pgids"]) | set(m["locust_pgids"]), reaper)


# --- a master started again -----------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_master_started_again_takes_the_rows_its_workers_send_again(tmp_path, reaper):
    """The master is SIGKILLed mid-run; its workers go on loading and keep the parts no master acknowledged; a
    master started again on the same port for the same run (--results-dir, --run-id) takes them. Every request of
    each worker (its own count of Locust's request events) is then exactly one row."""
    out = tmp_path / "out"
    counts = tmp_path / "counts.json"
    env = {**os.environ, "MMCHAOS_TEST_WORKER_COUNTS": str(counts)}
    port = free_port()
    seen = tmp_path / "seen.log"  # the stand-in's "request-id sha256" line per request, in the order it read them
    with standin_server(tmp_path / "standin.log", "--body-log", str(seen)) as s:

        def master():
            p = subprocess.Popen(
                [
                    PY,
                    "-m",
                    "locust",
                    "-f",
                    str(COUNTING),
                    "--master",
                    "--master-bind-host",
                    "127.0.0.1",
                    "--master-bind-port",
                    str(port),
                    "--expect-workers",
                    "2",
                    "--headless",
                    "-u",
                    "4",
                    "-r",
                    "4",
                    "-t",
                    "90s",
                    "--host",
                    s.base_url,
                    "--results-dir",
                    str(out),
                    "--run-id",
                    "R",
                    "--config-name",
                    "a",
                    "--image-preset",
                    "small",
                    "--pool-size",
                    "8",
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            reaper.add(p.pid)
            return p

        first = master()
        workers = [
            subprocess.Popen(
                [
                    PY,
                    "-m",
                    "locust",
                    "-f",
                    str(COUNTING),
                    "--worker",
                    "--master-host",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for _ in range(2)
        ]
        reaper.update(w.pid for w in workers)
        second = None
        try:

            def parts_of(pid):
                return list((out / "requests").glob(f"part-*-{pid}-*.parquet"))

            wait_for(
                lambda: all(len(parts_of(w.pid)) >= 2 for w in workers),
                "rows of both workers",
                running=lambda: all(p.poll() is None for p in (first, *workers)),
            )
            killpg(first.pid, signal.SIGKILL)
            t_gone = time.time()
            first.wait(timeout=10)
            seen_before = seen.stat().st_size

            def loading_without_master():
                # a worker's third request read after the kill was sent after it: each worker has 2 users
                ids = seen.read_bytes()[seen_before:].decode(errors="replace").split()[0::2]
                per_index = Counter(i.split("-")[2] for i in ids)  # mmc-<run>-<worker index>-<user>-<seq>
                return len(per_index) == 2 and min(per_index.values()) >= 3

            wait_for(
                loading_without_master,
                "requests of both workers while no master runs",
                running=lambda: all(w.poll() is None for w in workers),
            )
            second = master()
            t_back = time.time()

            def made_while_no_master():
                if not (out / "requests").is_dir():
                    return False
                rows = read_table(out, "requests").to_pandas()
                during = rows[(rows["t_start"] > t_gone) & (rows["t_start"] < t_back)]
                return during["worker"].nunique() == 2

            wait_for(
                made_while_no_master,
                "rows made while no master ran, taken by the second",
                running=lambda: all(p.poll() is None for p in (second, *workers)),
            )
            for w in workers:
                killpg(w.pid, signal.SIGTERM)  # they stop, and hand their last rows to the second master
            for w in workers:
                w.wait(timeout=60)
        finally:
            for p in (first, second, *workers):
                if p is not None and p.poll() is None:
                    killpg(p.pid, signal.SIGKILL)
        killpg(second.pid, signal.SIGTERM)  # it waits for workers that never come back: the stop ends the wait
        assert second.wait(timeout=30) is not None
    rows = read_table(out, "requests").to_pandas()
    assert not rows["request_id"].duplicated().any()  # parts sent to both masters are written once
    by_pid = per_worker(rows)
    for w in workers:
        own = json.loads(Path(f"{counts}.{w.pid}").read_text())
        g = by_pid[w.pid]
        assert len(g[g["outcome"] != schema.CUT]) == own > 0 and contiguous(g)
    ledger = json.loads((out / schema.WORKERS).read_text())
    assert ledger["lost"] == [] and sorted(pid_of(r["worker"]) for r in ledger["workers"]) == sorted(
        w.pid for w in workers
    )
    assert_no_orphans({first.pid, second.pid, *(w.pid for w in workers)}, reaper)


def test_a_flush_that_gives_way_writes_the_same_rows_in_slices_and_loses_none_when_interrupted(tmp_path):
    import pyarrow.parquet as pq

    from mmchaos.tables import SLICE, PartWriter

    rows = [{"request_id": f"r{i}", "kind": "text", "t_start": float(i)} for i in range(2 * SLICE + 7)]
    w = PartWriter(tmp_path / "q", schema.REQUESTS)
    pauses = []
    for r in rows:
        w.add(r)
    assert w.flush(pause=lambda: pauses.append(1)) == len(rows)
    assert len(pauses) == 2  # between three slices
    [part] = (tmp_path / "q").glob("part-*.parquet")
    assert pq.ParquetFile(part).num_row_groups == 3
    assert [r["request_id"] for r in pq.read_table(part).to_pylist()] == [r["request_id"] for r in rows]

    class Killed(BaseException):
        pass

    def killed():
        raise Killed

    w2 = PartWriter(tmp_path / "k", schema.REQUESTS)
    for r in rows:
        w2.add(r)
    with pytest.raises(Killed):
        w2.flush(pause=killed)  # a greenlet killed in its pause: the rows go back
    w2.add({"request_id": "late", "kind": "text"})
    assert w2.flush() == len(rows) + 1 and not list((tmp_path / "k").glob("part-*000001.parquet"))
    [part] = (tmp_path / "k").glob("part-*.parquet")
    assert [r["request_id"] for r in pq.read_table(part).to_pylist()] == [r["request_id"] for r in rows] + ["late"]
