"""Open-loop runs (--rate) on the stand-in server: each request sent at its arrival, never before; the lag of a
generator that cannot keep up recorded and judged by the rate gate; lanes of Locust's workers; bad input; campaigns
with a rate."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import TESTS, standin_server
from locust_run import locust, rows
from scipy import stats

from mmchaos.analysis.report import write_report
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner

STANDIN = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}}"

pytestmark = pytest.mark.integration  # every test here starts a process (Locust, the mmchaos command)


def scheduled(df):
    return df[df["t_sched"].notna()].sort_values("t_sched")


def test_requests_go_out_at_their_arrivals_and_say_when_they_were_due(standin, tmp_path):
    r = locust(
        "locustfiles/embeddings.py",
        standin.base_url,
        tmp_path,
        "--rate",
        "40",
        "--arrival",
        "constant",
        "--max-requests",
        "120",
        "--min-rate-ratio",
        "0",
        seconds=60,
    )  # ends at 120 requests
    assert r.returncode == 0, r.stdout[-2000:]
    df = rows(tmp_path)
    s = scheduled(df)
    assert len(s) >= 100, r.stdout[-2000:]
    assert np.allclose(np.diff(s["t_sched"]), 1 / 40, atol=1e-6)  # the schedule itself, whatever the machine did
    # a request never leaves before it is due, and its lag is the time from due to sent
    assert (s["t_start"] >= s["t_sched"] - 0.002).all()
    assert np.allclose(s["sched_lag_ms"], ((s["t_start"] - s["t_sched"]) * 1000).clip(lower=0), atol=5)
    retries = df[df["attempt"] > 1]
    assert retries["t_sched"].isna().all()  # a retry is the client's, not an arrival
    assert "open loop: asked 40 req/s (constant)" in r.stdout


def test_poisson_arrivals_reach_the_server_at_the_rate_asked_and_the_rows_hide_no_lag(tmp_path):
    """Judged where it is true: the stand-in logs when each request arrived, on its own clock, and the rate gate
    is on (its default: 95 % of the requests due sent)."""
    rate, window_s = 20, 15.0  # 400 requests take ~20 s: a 15 s window from the first arrival is inside the run
    log = tmp_path / "arrivals.log"
    with standin_server(tmp_path / "s.log", "--arrival-log", str(log)) as s:
        r = locust(
            "locustfiles/embeddings.py",
            s.base_url,
            tmp_path,
            "--rate",
            str(rate),
            "--max-requests",
            "400",
            "--weight-abort",
            "0",
            "--retry-policy",
            "none",
            seconds=120,
        )
    assert r.returncode == 0, r.stdout[-2000:]
    arrived = pd.read_csv(log, sep=" ", names=["request_id", "t", "route"]).groupby("request_id")["t"].min()
    df = scheduled(rows(tmp_path))
    df = df.assign(t_arrived=df["request_id"].map(arrived))
    assert df["t_arrived"].notna().all(), df[df["t_arrived"].isna()]  # every request sent reached the server
    t = np.sort(df["t_arrived"].to_numpy())
    # the count in a window after the first arrival is Poisson's, and given the count the times are uniform in it
    inside = t[(t > t[0]) & (t <= t[0] + window_s)] - t[0]
    lo, hi = stats.poisson.interval(0.999, rate * window_s)
    assert lo <= len(inside) <= hi, len(inside)
    assert stats.kstest(inside / window_s, "uniform").pvalue > 0.001
    assert stats.kstest(np.diff(t), "expon", args=(0, 1 / rate)).pvalue > 0.001  # the gaps the server saw
    # the lag a row reports is what the server saw, less the way there: never more, and the way is short (within
    # a quarter of the mean gap for 9 requests in 10, on a loaded machine too): lateness is not hidden by the rows
    server_lag_ms = (df["t_arrived"] - df["t_sched"]) * 1000
    way_ms = server_lag_ms - df["sched_lag_ms"]
    assert (way_ms >= -1).all(), df[way_ms < -1]
    assert way_ms.quantile(0.9) <= 1000 / rate / 4, way_ms.describe()


def test_a_generator_that_cannot_hold_the_rate_says_so_and_the_gate_fails(tmp_path):
    # two users, each answer 200 ms: at most 10 requests a second go out of the 50 due
    with standin_server(tmp_path / "s.log", "--delay-ms", "200") as s:
        r = locust(
            "locustfiles/embeddings.py",
            s.base_url,
            tmp_path,
            "--rate",
            "50",
            "--max-concurrency",
            "2",
            "--max-requests",
            "30",
            "--retry-policy",
            "none",
            seconds=60,
        )
    assert r.returncode == 1, r.stdout[-2000:]
    assert "the generator did not hold the rate" in r.stdout
    assert r.stdout.count("mmchaos: falling behind --rate 50: ") == 1  # said once while it ran
    assert "gate failed: requests sent of those due at --rate 50" in r.stdout
    df = scheduled(rows(tmp_path))
    assert df["user_id"].nunique() == 2  # --max-concurrency: the users are the requests in flight
    assert df["sched_lag_ms"].iloc[-5:].min() > 500  # late and later: coordinated omission, recorded


def test_locust_workers_take_their_lanes_of_the_one_schedule(standin, tmp_path):
    r = locust(
        "locustfiles/embeddings.py",
        standin.base_url,
        tmp_path,
        "--rate",
        "30",
        "--arrival",
        "constant",
        "--processes",
        "2",
        "--max-requests",
        "40",
        "--min-rate-ratio",
        "0",
        seconds=60,
    )
    assert r.returncode == 0, r.stdout[-2000:]
    df = scheduled(rows(tmp_path))
    assert df["worker"].nunique() == 2
    for _, g in df.groupby("worker"):
        # every second arrival of the one schedule: each gap is whole slots of 2/30 s; an arrival the run's
        # --max-requests stop cut before its row was written (a loaded machine) leaves a gap of two slots
        slots = np.diff(g["t_sched"]) / (2 / 30)
        assert len(g) >= 18 and np.allclose(slots, np.round(slots), atol=1e-4) and (np.round(slots) >= 1).all()
        assert (np.round(slots) == 1).mean() >= 0.9, slots


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rate", "0"], "argument --rate: must be more than 0"),
        (["--rate", "-2"], "argument --rate: must be more than 0"),
        (["--rate", "5", "--arrival", "zipf"], "argument --arrival: invalid choice: 'zipf'"),
        (["--rate", "5", "--shape", "spike"], "--shape spike varies the number of users"),
        (["--rate", "5", "--burstiness", "2"], "--burstiness is the shape of --arrival gamma"),
        (["--max-concurrency", "3"], "--max-concurrency caps an open-loop run: give --rate too"),
    ],
)
def test_bad_open_loop_input_is_one_line_and_exit_2(tmp_path, args, message):
    r = locust("locustfiles/embeddings.py", "http://127.0.0.1:9", tmp_path, *args, seconds=2)
    assert r.returncode == 2
    lines = [ln for ln in r.stdout.splitlines() if message in ln]
    assert len(lines) == 1 and "Traceback" not in r.stdout, r.stdout[-2000:]


def test_a_rate_on_a_locustfile_that_sets_its_own_pace_is_refused(tmp_path):
    r = locust("locustfiles/probes.py", "http://127.0.0.1:9", tmp_path, "--rate", "5", seconds=2)
    assert r.returncode == 2 and "--rate paces the realistic mix" in r.stdout and "Traceback" not in r.stdout


def campaign(tmp_path, workload: str, sweep: str = "") -> object:
    f = tmp_path / "c.toml"
    f.write_text(f'''
[campaign]
name = "ol"
target = "command"
command = "{STANDIN}"

[workload]
locustfile = "{TESTS.parent / "locustfiles/embeddings.py"}"
duration = 30
{workload}

[workload.options]
image_preset = "small"
pool_size = 16

[crash]
startup_timeout = 30
{sweep}
[[config]]
name = "healthy"
''')
    return f


def test_a_campaign_at_a_rate_records_the_schedule_and_reports_it(tmp_path):
    f = campaign(tmp_path, 'rate = 20\narrival = "constant"\nmax_requests = 60')
    [result] = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    assert result.status == "completed", result.error
    trial = tmp_path / "results" / "ol" / "healthy" / "t000"
    manifest = json.loads((trial / "manifest.json").read_text())
    assert manifest["workload"]["rate"] == 20 and manifest["workload"]["arrival"] == "constant"
    s = scheduled(rows(trial))
    assert len(s) >= 50 and np.allclose(np.diff(s["t_sched"]), 1 / 20, atol=1e-6)
    report = write_report(tmp_path / "results" / "ol").markdown.read_text()
    assert "## Open-loop arrivals" in report and "| healthy | 20.0 | constant | 1 | " in report


@pytest.mark.parametrize(
    "workload, sweep, message",
    [
        ("rate = 0", "", "rate must be more than 0 requests per second"),
        ("rate = 5\nusers = 4", "", "users and rate exclude each other"),
        ('rate = 5\nshape = "ramp"', "", "shape ramp varies the number of users"),
        ('rate = 5\narrival = "bursty"', "", "arrival must be one of poisson, constant, gamma"),
        ("rate = 5\nburstiness = 0.5", "", "burstiness is the shape of arrival gamma"),
        ("max_concurrency = 4", "", "max_concurrency caps an open-loop run: give rate too"),
        ("", "[sweep]\nrate = [5, 0]", "[sweep] rate = 0: rate must be more than 0"),
        ("users = 4", "[sweep]\nrate = [5, 10]", "users and rate exclude each other"),
    ],
)
def test_bad_open_loop_campaigns_are_one_line_errors(tmp_path, workload, sweep, message):
    with pytest.raises(campaign_plan.CampaignError) as e:
        campaign_plan.load(campaign(tmp_path, workload, sweep))
    assert message in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith(str(tmp_path))


def test_rate_is_a_sweep_knob(tmp_path):
    plan = campaign_plan.load(campaign(tmp_path, 'arrival = "gamma"\nburstiness = 0.5', "[sweep]\nrate = [5, 20]"))
    assert [r.point for r in plan.runs()] == [{"rate": 5}, {"rate": 20}]
    argv = campaign_runner.locust_argv(
        plan, plan.configs[0], 1, tmp_path, "http://127.0.0.1:9", "m", "r", {"rate": 20}, 0
    )
    assert argv[argv.index("--rate") + 1] == "20" and argv[argv.index("--arrival") + 1] == "gamma"
