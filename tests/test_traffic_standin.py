"""Locust plumbing on the stand-in server: one row per request, kinds by weight, aborts, refusals, workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


from conftest import standin_server
from locust_run import ROOT, locust, locust_request_count, locust_rows, rows
from mmchaos.options import WEIGHTS
from mmchaos import schema
from mmchaos.tables import read_table


def test_headless_run_records_exactly_one_row_per_request(standin, tmp_path):
    r = locust("locustfiles/embeddings.py", standin.base_url, tmp_path, users=4, seconds=4)
    assert r.returncode == 0, r.stdout[-2000:]  # a healthy server: every gate holds
    df = rows(tmp_path)
    assert len(locust_rows(df)) == locust_request_count(tmp_path) > 50
    assert set(df["outcome"]) <= set(schema.OUTCOMES)
    assert df["t_start"].notna().all() and df["latency_ms"].notna().all()
    assert (df.groupby(["worker", "user_id"])["seq"].apply(lambda s: sorted(s) == list(range(1, len(s) + 1)))).all()
    img = df[df["kind"] == "valid_image"]
    assert img["image_hashes"].str.len().eq(16).all() and (img["n_images"] == 1).all()
    health = read_table(tmp_path, "health").to_pandas()
    assert len(health) >= 8 and health["ok"].all()  # polled every 0.25 s through a 4 s run


def test_think_time_spaces_each_users_requests(standin, tmp_path):
    """--wait-ms W: a pause uniform in [0, W] ms after each request, every user going on (mean W / 2)."""
    r = locust("locustfiles/embeddings.py", standin.base_url, tmp_path, "--wait-ms", "200", users=2, seconds=4)
    assert r.returncode == 0, r.stdout[-2000:]
    df = locust_rows(rows(tmp_path)).sort_values("t_start")
    gaps = df.groupby("user_id")["t_start"].diff().dropna()
    assert df.groupby("user_id").size().min() >= 10, r.stdout[-2000:]  # ~4 s / 0.1 s each, not one and stuck
    assert 0.06 < gaps.median() < 0.3 and gaps.quantile(0.9) < 0.5, gaps.describe()  # one slow answer may stand out


def test_kinds_follow_their_weights(standin, tmp_path):
    weights = {k: w for k, (w, _) in WEIGHTS.items()}
    r = locust("locustfiles/embeddings.py", standin.base_url, tmp_path, "--abort-after-ms", "2000",
               "--max-requests", "600", users=6, seconds=60)  # ends at 600 requests, however busy the machine
    df = rows(tmp_path)
    n = len(df)
    assert n > 300, r.stdout[-1500:]
    total = sum(weights.values())
    for kind, w in weights.items():
        p = w / total
        share = (df["kind"] == kind).mean()
        tol = 4 * (p * (1 - p) / n) ** 0.5 + 0.005  # four standard errors
        assert abs(share - p) <= tol, (kind, share, p, tol)


def test_aborts_are_rows_with_outcome_aborted(tmp_path):
    with standin_server(tmp_path / "s.log", "--delay-ms", "150") as s:
        r = locust("locustfiles/embeddings.py", s.base_url, tmp_path, "--weight-valid-image", "1",
                   "--weight-abort", "3", "--weight-text", "0", "--weight-multi-image", "0", "--weight-batch", "0",
                   "--weight-tokenize", "0", "--weight-malformed-pre", "0", "--weight-malformed-post", "0",
                   "--abort-after-ms", "30", users=4, seconds=3)
    df = rows(tmp_path)
    assert len(locust_rows(df)) == locust_request_count(tmp_path)
    aborts = df[df["kind"] == "abort"]
    assert len(aborts) > 5, r.stdout[-1500:]
    assert (aborts["outcome"] == schema.ABORTED).mean() > 0.9
    assert aborts.loc[aborts["outcome"] == schema.ABORTED, "status"].isna().all()
    assert (df.loc[df["kind"] == "valid_image", "outcome"] == schema.OK).mean() > 0.9


def test_refused_connections_are_rows(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    r = locust("locustfiles/embeddings.py", f"http://127.0.0.1:{port}", tmp_path, "--model", "m",
               "--max-requests", "200", users=2, seconds=3)
    df = rows(tmp_path)
    assert len(locust_rows(df)) == locust_request_count(tmp_path) > 0, r.stdout[-1500:]
    assert (locust_rows(df)["outcome"] == schema.CONNECTION_ERROR).all()
    assert len(df) <= 200  # the request budget bounds the loop


def test_master_with_two_workers_records_rows_from_both(standin, tmp_path):
    out = tmp_path
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    mport = port.getsockname()[1]
    port.close()
    common = ["-f", str(ROOT / "locustfiles/embeddings.py")]
    master = subprocess.Popen(
        [sys.executable, "-m", "locust", *common, "--master", "--master-bind-host", "127.0.0.1",
         "--master-bind-port", str(mport), "--expect-workers", "2", "--headless", "-u", "4", "-r", "4", "-t", "4s",
         "--host", standin.base_url, "--only-summary", "--json-file", str(out / "locust"), "--results-dir", str(out),
         "--image-preset", "small", "--pool-size", "16"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, start_new_session=True)
    workers = [subprocess.Popen(
        [sys.executable, "-m", "locust", *common, "--worker", "--master-host", "127.0.0.1", "--master-port",
         str(mport)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        for _ in range(2)]
    try:
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
