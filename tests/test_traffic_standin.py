"""Locust's processes on the stand-in server: a master and two workers (the rows of a run in one process are
tested in-process, in test_locust_users.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from locust_run import ROOT, locust_request_count, locust_rows, rows
from test_webui import wait_for

pytestmark = pytest.mark.integration  # every test here starts processes (stand-in servers, Locust, campaigns)


def test_master_with_two_workers_records_rows_from_both(standin, tmp_path):
    out = tmp_path
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    mport = port.getsockname()[1]
    port.close()
    common = ["-f", str(ROOT / "locustfiles/embeddings.py")]
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "locust",
            *common,
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
            "120s",  # only a hung run reaches it: the test stops the run once both workers' rows are in
            "--host",
            standin.base_url,
            "--only-summary",
            "--json-file",
            str(out / "locust"),
            "--results-dir",
            str(out),
            "--image-preset",
            "small",
            "--pool-size",
            "16",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "locust",
                *common,
                "--worker",
                "--master-host",
                "127.0.0.1",
                "--master-port",
                str(mport),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        for _ in range(2)
    ]
    try:
        # the master writes each worker's rows as it takes them (its parts are named by the worker's pid); then a
        # SIGTERM ends the run as the campaign runner ends one: the workers quit, their last rows on the master
        wait_for(
            lambda: all(list((out / "requests").glob(f"part-*-{w.pid}-*.parquet")) for w in workers),
            90,
            "rows of both workers",
        )
        master.send_signal(signal.SIGTERM)
        stdout, _ = master.communicate(timeout=120)
        for w in workers:
            w.wait(timeout=30)
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    df = rows(out)
    assert df["worker"].nunique() == 2, stdout[-1500:]
    assert len(locust_rows(df)) == locust_request_count(out)
    assert df["run_id"].nunique() == 1  # the master's run id reached both workers
