"""Open-loop arrivals against real vLLM (the session's 0.32.0 server, no start of its own): the server receives
the requests the rows say were sent, at the schedule's times, and a rate the generator cannot hold is said and
fails the run."""

from __future__ import annotations

import re

import numpy as np
import pytest
import requests
from locust_run import locust, only, rows
from prometheus_client.parser import text_string_to_metric_families

from mmchaos.payloads import routes

pytestmark = pytest.mark.engine
HANDLERS = ("/v1/embeddings", "/tokenize", *routes.PATHS)  # every route the mix sends to


def served(base_url: str) -> float:
    """Requests vLLM's API server counted on the routes the mix sends to (its http_requests_total)."""
    text = requests.get(base_url + "/metrics", timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "http_requests_total" and s.labels.get("handler") in HANDLERS
    )


def test_open_loop_at_a_rate_the_server_holds(fixed_server, tmp_path):
    before = served(fixed_server.base_url)
    # ends at 60 requests; fresh images: nothing another test cached. The rate gate is on (its default: 95 % of
    # the requests due sent): at 5 req/s the pool grows to the server's latency, whatever a busy machine makes it
    r = locust(
        "locustfiles/embeddings.py",
        fixed_server.base_url,
        tmp_path,
        "--rate",
        "5",
        "--arrival",
        "constant",
        "--weight-abort",
        "0",
        "--max-requests",
        "60",
        "--image-seed",
        "2701",
        "--fresh-fraction",
        "1",
        seconds=120,
        timeout=240,
    )
    after = served(fixed_server.base_url)
    df = rows(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:]
    s = df[df["t_sched"].notna()].sort_values("t_sched")
    sent, due = map(
        int,
        re.search(r"open loop: asked 5 req/s \(constant\); sent (\d+) of the (\d+) requests due", r.stdout).groups(),
    )
    # the line says what the rows hold: the arrivals sent; the budget of 60 counts the SDK's retries too (of a 500
    # the catalogue's truncate cases get), which are no arrivals of their own
    assert sent == len(s) and len(df) == 60 and due >= sent, r.stdout[-1500:]
    assert np.allclose(np.diff(s["t_sched"]), 1 / 5, atol=1e-6) and (s["t_start"] >= s["t_sched"] - 0.002).all()
    # what the rows say was sent is what the server counted: answered ones at least, every row at most
    answered = df["status"].notna().sum()
    assert answered <= after - before <= len(df), (answered, after - before, len(df))


def test_a_rate_the_generator_cannot_hold_fails_the_run(fixed_server, tmp_path):
    # one user against a real server: each request waits for the last one's answer (tens of ms here)
    r = locust(
        "locustfiles/embeddings.py",
        fixed_server.base_url,
        tmp_path,
        "--rate",
        "400",
        "--max-concurrency",
        "1",
        *only(text=1),
        "--max-requests",
        "40",
        seconds=120,
        timeout=240,
    )
    assert r.returncode == 1, r.stdout[-3000:]
    assert "the generator did not hold the rate" in r.stdout and "gate failed: requests sent of those due" in r.stdout
    s = rows(tmp_path).dropna(subset=["t_sched"]).sort_values("t_sched")
    # the 40th arrival was due 0.1 s in and went out after 39 answers: its wait is in its row
    assert s["sched_lag_ms"].iloc[-1] > 50, s[["t_sched", "sched_lag_ms", "latency_ms"]].tail()
