"""The mmchaos panel of the web UI, without a browser: its JSON (/mmchaos/state), the rows it adds to Locust's
/stats/requests for its tabs, and the start form's options reaching the run. On the stand-in server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import requests
from conftest import standin_server
from helpers import wait_until
from locust_run import ROOT, rows

from mmchaos import schema
from mmchaos.harness.servers.processes import free_port
from mmchaos.locustfiles.plugin import panel_tables
from mmchaos.locustfiles.plugin.live_state import LiveState
from mmchaos.locustfiles.plugin.outcomes import CATEGORIES, Attempt, Outcomes, category, classify_request
from mmchaos.locustfiles.plugin.watchers import parse_metrics
from mmchaos.locustfiles.plugin.web_form import apply_mangled_form_fields
from mmchaos.signatures import Signatures

SMALL = ["--image-preset", "small", "--pool-size", "16"]


class LocustUI:
    """``locust`` with its web UI on 127.0.0.1, in its own process group (stopped by that group's id)."""

    def __init__(self, out: Path, *args: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out_file = out / f"locust-{self.port}.out"
        self._out = open(self.out_file, "w")
        cmd = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "locustfiles/embeddings.py"),
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(self.port),
            *args,
        ]
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        self.pgid = self.proc.pid

    def wait_up(self, timeout: float = 60) -> LocustUI:
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                requests.get(self.url + "/", timeout=1)
                return self
            except requests.RequestException:
                time.sleep(0.1)  # polling for the UI to listen
        raise AssertionError(f"web UI not up after {timeout} s: {self.output()}")

    def state(self) -> dict:
        r = requests.get(self.url + "/mmchaos/state", timeout=5)
        r.raise_for_status()
        return r.json()

    def output(self, tail: int = 3000) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.out_file.read_text()[-tail:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.pgid, signal.SIGTERM)  # Locust quits gracefully on SIGTERM
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.pgid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._out.close()


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    return wait_until(predicate, what, cap=timeout, interval=interval)


def counts_from_rows(df: pd.DataFrame) -> dict:
    """Per kind, per panel category, from the recorded rows."""
    cats = [category(None if pd.isna(s) else int(s), o) for s, o in zip(df["status"], df["outcome"])]
    out = {}
    for (kind, cat), n in pd.DataFrame({"kind": df["kind"], "cat": cats}).value_counts().items():
        out.setdefault(kind, dict.fromkeys(CATEGORIES, 0))[cat] = int(n)
    return {k: {**c, "total": sum(c.values())} for k, c in out.items()}


def run_finished_and_flushed(ui: LocustUI, out: Path):
    """The run stopped and its rows are on disk (the recorder flushes at test_stop, after the state changes)."""
    st = ui.state()
    if st["runner_state"] != "stopped":
        return None
    df = rows(out)
    df = df[df["run_id"] == st["run_id"]] if len(df) else df
    return (st, df) if len(df) == st["outcomes"]["total"]["total"] > 0 else None


def test_panel_counts_match_the_recorded_rows(standin, tmp_path):
    # ends at its request budget, however busy the machine (the run time only bounds it)
    ui = LocustUI(
        tmp_path,
        "--host",
        standin.base_url,
        "--autostart",
        "-u",
        "4",
        "-r",
        "4",
        "-t",
        "60s",
        "--max-requests",
        "120",
        "--autoquit",
        "120",
        "--results-dir",
        str(tmp_path),
        *SMALL,
    ).wait_up()
    try:
        st, df = wait_for(lambda: run_finished_and_flushed(ui, tmp_path), 90, "the run to end and its rows")
        assert len(df) >= 120
        assert st["outcomes"]["kinds"] == counts_from_rows(df)
        assert st["run_id"] == df["run_id"].unique().item()
        assert st["counts_source"].startswith("request events")
        assert st["health"]["watching"] and st["health"]["polls_ok"] >= 1 and st["health"]["state"] == "ok"
        assert not [e for e in st["events"] if e["event"] == "crash"]
        assert st["mm_cache"]["available"] is False and st["mm_cache"]["text"].startswith("n/a")
        # the rows of the tabs, as Locust's UI receives them with its stats
        stats = requests.get(ui.url + "/stats/requests", timeout=5).json()
        tabs = {t["key"]: t["data"] for t in stats["extended_stats"]}
        assert set(tabs) == {
            panel_tables.TAB_VERDICT,
            panel_tables.TAB_EVENTS,
            panel_tables.TAB_OUTCOMES,
            panel_tables.TAB_SERVER,
            panel_tables.TAB_FAULTS,
        }
        # no fault control given: the faults tab says how to get one
        assert "--fault-control" in tabs[panel_tables.TAB_FAULTS][0]["detail"]
        verdict = {r["item"]: r for r in tabs[panel_tables.TAB_VERDICT]}
        assert verdict["verdict"]["state"] == st["verdict"]["title"]
        assert verdict["gate max-crashes"]["state"] == "passed"
        table = {r["kind"]: r for r in tabs[panel_tables.TAB_OUTCOMES]}
        assert table["all"]["total"] == len(df)
        for kind, c in counts_from_rows(df).items():
            assert table[kind]["total"] == c["total"] and table[kind]["c4xx"] == c["4xx"]
            assert table[kind]["ok"] == c["ok"] and table[kind]["aborted"] == c["aborted"]
        assert any(
            r["item"] == "mm-cache hit rate" and r["value"].startswith("n/a") for r in tabs[panel_tables.TAB_SERVER]
        )
    finally:
        ui.stop()


def test_master_gets_the_counts_from_its_workers(standin, tmp_path):
    mport = free_port()
    ui = LocustUI(
        tmp_path,
        "--host",
        standin.base_url,
        "--master",
        "--master-bind-host",
        "127.0.0.1",
        "--master-bind-port",
        str(mport),
        "--expect-workers",
        "2",
        "--autostart",
        "-u",
        "4",
        "-r",
        "4",
        "-t",
        "120s",  # only a hung run reaches it: the test stops the run once both workers' rows are in
        "--autoquit",
        "120",
        "--results-dir",
        str(tmp_path),
        *SMALL,
    )
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(ROOT / "locustfiles/embeddings.py"),
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
        ui.wait_up()
        # the master writes each worker's rows as it takes them (its parts are named by the worker's pid): once
        # both have rows, the run is stopped as the UI's Stop button does
        wait_for(
            lambda: all(list((tmp_path / "requests").glob(f"part-*-{w.pid}-*.parquet")) for w in workers),
            90,
            "rows of both workers",
        )
        requests.post(ui.url + "/stop", timeout=10).raise_for_status()
        # workers report every 3 s, the last time after the stop
        st, df = wait_for(lambda: run_finished_and_flushed(ui, tmp_path), 90, "the workers' final reports")
        assert df["worker"].nunique() == 2
        assert st["workers_reporting"] == 2 and "workers" in st["counts_source"]
        assert st["outcomes"]["kinds"] == counts_from_rows(df)
    finally:
        ui.stop()
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGTERM)
            try:
                w.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)


def _swarm(ui: LocustUI, host: str, **fields) -> None:
    """Start a run as the UI's start form does: a POST of every field, snake_case names, string values."""
    # each run ends at its request budget, however busy the machine (the run time only bounds it)
    form = {"user_count": "4", "spawn_rate": "4", "host": host, "run_time": "60s", "max_requests": "60", **fields}
    r = requests.post(ui.url + "/swarm", data=form, timeout=10)
    assert r.ok and r.json()["success"], r.text


def test_start_form_options_take_effect_run_after_run(standin, tmp_path):
    ui = LocustUI(tmp_path, "--host", standin.base_url, *SMALL).wait_up()
    zero = {f"weight_{k}": "0" for k in schema.KINDS if k != "probe"}
    # each run its own results folder, set in the form (two runs of one process must not share one: both
    # recorders would name their parts alike)
    out1, out2 = tmp_path / "run1", tmp_path / "run2"
    try:
        # run 1: text only; base64_fraction arrives as the form spells it (base_64_fraction)
        _swarm(
            ui,
            standin.base_url,
            results_dir=str(out1),
            **{**zero, "weight_text": "5", "base_64_fraction": "0.5", "seed": "7"},
        )
        st1, run1 = wait_for(lambda: run_finished_and_flushed(ui, out1), 90, "run 1")
        assert st1["options"]["weight_text"] == 5 and st1["options"]["weight_valid_image"] == 0
        assert st1["options"]["base64_fraction"] == 0.5 and st1["options"]["seed"] == 7
        assert len(run1) > 20 and set(run1["kind"]) == {"text"}
        # run 2, same process: the cached traffic must follow the new weights
        _swarm(
            ui,
            standin.base_url,
            results_dir=str(out2),
            **{**zero, "weight_valid_image": "3", "weight_malformed_post": "1"},
        )
        wait_for(lambda: ui.state()["run_id"] != st1["run_id"], 30, "run 2 to start")
        st2, run2 = wait_for(lambda: run_finished_and_flushed(ui, out2), 90, "run 2")
        assert len(run2) > 20 and set(run2["kind"]) == {"valid_image", "malformed_post"}
        assert st2["outcomes"]["kinds"] == counts_from_rows(run2)  # the panel restarts its counts each run
    finally:
        ui.stop()


def _states_until_running(ui: LocustUI, limit_s: float = 60) -> list[str]:
    """The run's state as Locust's UI polls it (/stats/requests), from a start until it runs."""
    seen, deadline = [], time.time() + limit_s
    while time.time() < deadline and len(seen) < 10_000:
        state = requests.get(ui.url + "/stats/requests", timeout=5).json()["state"]
        seen.append(state)
        if state in ("running", "stopped"):
            return seen
    raise AssertionError(f"not running after {limit_s} s: {seen[-5:]}")


def test_a_started_run_never_reads_ready_to_the_ui(standin, tmp_path):
    """Locust's UI takes a "ready" polled after its Start for the end of the run: it shows the start form again
    and stops polling, while the run goes on. Locust itself says "ready" until test_start has run and users spawn,
    and answers from a 2-s memo; the UI must read "spawning". Twice: the second start of a process too."""
    ui = LocustUI(tmp_path, "--host", standin.base_url).wait_up()  # the web UI's default pool, as users get it
    try:
        for run in ("run1", "run2"):
            _swarm(ui, standin.base_url, results_dir=str(tmp_path / run), run_time="2s")
            seen = _states_until_running(ui)
            assert "ready" not in seen, seen
            wait_for(lambda: ui.state()["runner_state"] == "stopped", 60, f"{run} to end")
    finally:
        ui.stop()


@pytest.mark.integration
def test_crash_and_drift_from_health_and_server_log(tmp_path):
    log = tmp_path / "server.log"
    # the server dies at its 151st embedding request and the run ends at its budget, however busy the machine: no
    # wait for a count of requests reached in a fixed time. The refusals after the crash (with the client's pauses
    # and retries, ~10 s) leave the panel the time to name it from the log
    with standin_server(log, "--die-after", "150") as s:
        ui = LocustUI(
            tmp_path,
            "--host",
            s.base_url,
            "--autostart",
            "-u",
            "4",
            "-r",
            "4",
            "-t",
            "120s",
            "--max-requests",
            "220",
            "--autoquit",
            "120",
            "--results-dir",
            str(tmp_path),
            "--server-log",
            str(log),
            *SMALL,
        ).wait_up()
        try:

            def crashed():
                st = ui.state()
                crash = [e for e in st["events"] if e["event"] == "crash"]
                return (st, crash[0]) if crash and crash[0]["signature"] == "detokenizer_assert" else None

            st, crash = wait_for(crashed, 120, "a crash named detokenizer_assert")
            assert crash["source"] == "health" and "refused" in crash["detail"]
            drift = [e for e in st["events"] if e["event"] == "drift"]
            assert drift and drift[0]["signature"] == "cache_drift" and "ab12cd34ef" in drift[0]["detail"]
            assert st["health"]["state"] == "refused" and st["health"]["last_ok"] < crash["t"]
            st, df = wait_for(lambda: run_finished_and_flushed(ui, tmp_path), 120, "the run to end")
            assert st["outcomes"]["total"]["refused"] > 0
            assert st["outcomes"]["kinds"] == counts_from_rows(df)
        finally:
            ui.stop()


# -- the panel's logic, fed directly ---------------------------------------------------------------------------
def _panel(server_log: str | None = None) -> LiveState:
    p = LiveState(Signatures.load(), "test")
    p.reset("r1")
    p.watching = True
    p.server_log = server_log
    return p


def _resp(status: int, text: str):
    return SimpleNamespace(status_code=status, text=text, error=None)


def _request(p: LiveState, response, context, t: float) -> None:
    p.on_attempt(classify_request(p.sigs, response, context, None, t))


def test_503_cache_miss_answers_are_drift_events():
    p = _panel()
    body = '{"error": {"message": "Multi-modal processor cache miss. <b>retry</b>", "code": 503}}'
    _request(p, _resp(503, body), {"kind": "valid_image", "final": False}, 100.0)
    _request(p, _resp(503, '{"error": {"message": "overloaded"}}'), {"kind": "text"}, 101.0)
    _request(p, _resp(200, "{}"), {"kind": "text"}, 102.0)
    st = p.state()
    assert st["outcomes"]["kinds"]["valid_image"]["503"] == 1 and st["outcomes"]["kinds"]["text"]["503"] == 1
    assert st["outcomes"]["kinds"]["text"]["ok"] == 1 and st["outcomes"]["drift_503"] == 1
    (drift,) = [e for e in st["events"] if e["event"] == "drift"]
    assert drift["signature"] == "cache_miss_503" and "<b>retry</b>" in drift["detail"]  # raw: the UI escapes
    assert st["outcomes"]["last_error"]["valid_image"] == "Multi-modal processor cache miss. <b>retry</b>"
    # the verdict so far: the text request's 503 was its last attempt, the cache miss was to be retried
    assert st["verdict"]["level"] == "fails"
    checks = {c["check"]: c["state"] for c in st["verdict"]["checks"]}
    assert checks["normal_ok"] == "failed" and checks["no_drift"] == "failed"


def test_worker_reports_merge_and_keep_their_run():
    w = Outcomes()
    w.add(Attempt("abort", None, None, schema.ABORTED, None, True, "client gave up", 1.0, None))
    w.add(
        Attempt(
            "valid_image",
            None,
            503,
            schema.HTTP_ERROR,
            None,
            False,
            "Multi-modal processor cache miss.",
            2.0,
            "cache_miss_503",
        )
    )
    w.add(Attempt("valid_image", None, 200, schema.OK, None, True, None, 2.6, None))
    p = _panel()
    p.on_worker_report("w1", w.to_report())
    p.on_worker_report("w2", w.to_report())
    st = p.state()
    assert st["outcomes"]["total"]["total"] == 6 and st["outcomes"]["kinds"]["abort"]["aborted"] == 2
    assert st["workers_reporting"] == 2 and st["outcomes"]["drift_503"] == 2
    counts = p.counts()
    assert counts.attempts == 6 and counts.valid_groups == 2 and counts.valid_uncured == 0
    assert counts.server_attempts == 2 and counts.drift_answers == 2 and counts.poison_sent == 2
    assert st["verdict"]["level"] == "retryable"


def test_health_transitions_make_crash_recovery_and_hang_events():
    p = _panel()
    t = 1000.0
    p.on_health({"t": t, "ok": True, "status": 200, "error": None})
    p.on_health({"t": t + 0.25, "ok": False, "status": 500, "error": None})
    p.on_health({"t": t + 0.5, "ok": False, "status": None, "error": "ConnectionRefusedError"})
    p.on_health({"t": t + 5, "ok": True, "status": 200, "error": None})
    for i in range(50):  # no answer at all for 12 s
        p.on_health({"t": t + 6 + i * 0.25, "ok": False, "status": None, "error": "TimeoutError"})
    ev = [(e["event"], e["signature"]) for e in reversed(p.state()["events"])]
    assert ev == [("crash", "unclassified (no --server-log)"), ("recovered", ""), ("crash", "hang")]
    assert [s["state"] for s in p.state()["health"]["segments"]] == ["ok", "HTTP 500", "refused", "ok", "no answer"]


def test_crash_is_named_by_the_log_lines_that_arrive_after_it(tmp_path):
    from mmchaos.logtail import LogTail

    log = tmp_path / "server.log"
    log.write_text("INFO startup\n")
    p = _panel(str(log))
    tail = LogTail(log)
    tail.skip_to_end()
    p.on_health({"t": 1.0, "ok": True, "status": 200, "error": None})
    p.on_health({"t": 2.0, "ok": False, "status": None, "error": "ConnectionRefusedError"})
    assert p.state()["events"][0]["signature"] == "unknown"  # nothing fatal logged yet
    with open(log, "a") as f:
        f.write(
            "\x1b[1;36m(APIServer pid=1)\x1b[0;0m WARNING P0/P1 cache drift mm_hashes=['0123456789ab']\n"
            "ERROR EngineDeadError: <script>x()</script>\n    assert req_state.detokenizer is not None\n"
        )
    p.read_log(tail)
    st = p.state()
    crash = [e for e in st["events"] if e["event"] == "crash"]
    assert crash[0]["signature"] == "detokenizer_assert"  # the most specific fatal signature
    sigs = {e["signature"] for e in st["events"]}
    assert {"cache_drift", "engine_dead", "detokenizer_assert"} <= sigs
    assert not any("\x1b" in e["detail"] for e in st["events"])
    assert any("<script>x()</script>" in e["detail"] for e in st["events"])  # raw text: the UI escapes it
    assert st["server_log"]["lines_read"] == 3


METRICS_V030 = """# HELP vllm:mm_cache_queries_total Multi-modal cache queries.
# TYPE vllm:mm_cache_queries_total counter
vllm:mm_cache_queries_total{engine="0",model_name="m"} %d
# HELP vllm:mm_cache_hits_total Multi-modal cache hits.
# TYPE vllm:mm_cache_hits_total counter
vllm:mm_cache_hits_total{engine="0",model_name="m"} %d
# HELP vllm:num_requests_running Running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1
"""


def test_mm_cache_hit_rate_from_the_scraped_counters():
    p = _panel()
    for t, q, h in [(0.0, 100, 50), (5.0, 150, 80), (12.0, 200, 120), (15.0, 300, 200)]:
        for row in parse_metrics(METRICS_V030 % (q, h), t):
            p.on_metric(row)
    mm = p.state()["mm_cache"]
    assert mm["available"] and mm["names"] == ["vllm:mm_cache_hits_total", "vllm:mm_cache_queries_total"]
    assert mm["cumulative"] == pytest.approx(200 / 300)
    assert mm["run"] == pytest.approx(150 / 200)
    assert mm["recent"] == pytest.approx((200 - 80) / (300 - 150))  # since the last scrape >= 10 s before
    rows_ = {r["item"]: r["value"] for r in panel_tables.tables(p, p.state())[3]["data"]}
    assert rows_["mm-cache hit rate, this run"] == "75.0%"


def test_mm_cache_hit_rate_is_na_without_the_counters():
    p = _panel()
    for row in parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n", 1.0):
        p.on_metric(row)
    assert p.state()["mm_cache"] == {
        "available": False,
        "text": "n/a (this server's /metrics has no mm-cache counters)",
    }


def test_form_fields_renamed_by_the_ui_reach_their_option():
    o = SimpleNamespace(base64_fraction=0.1, weight_text=12, no_watch=False)
    applied = apply_mangled_form_fields(o, {"base_64_fraction": "0.4", "weight_text": "3", "x": "1"})
    assert applied == ["base64_fraction"] and o.base64_fraction == 0.4
    assert o.weight_text == 12  # fields Locust knows are left to Locust


def test_categories():
    assert category(200, "ok") == "ok"
    assert category(400, "http_error") == "4xx"
    assert category(503, "http_error") == "503"
    assert category(500, "http_error") == "5xx"
    assert category(302, "http_error") == "other"
    assert category(None, "connection_error") == "refused"
    assert category(None, "timeout") == "timeout"
    assert category(None, "aborted") == "aborted"


def test_drift_and_crash_events_name_their_cause_by_the_image_the_server_named(tmp_path):
    """The panel applies the report's cause rule live: the drift line names the reuse (not answered yet when the
    line is read), whose image had failed after render in the poison 400; the crash after it takes that cause,
    and the events tab shows it in its own column, with the route the poison went through."""
    from mmchaos.logtail import LogTail

    log = tmp_path / "server.log"
    log.write_text("INFO startup\n")
    p = _panel(str(log))
    tail = LogTail(log)
    tail.skip_to_end()
    p.on_health({"t": 1.0, "ok": True, "status": 200, "error": None})

    def ctx(kind, rid, hashes, **extra):
        return {"kind": kind, "request_id": rid, "image_hashes": hashes, **extra}

    _request(p, _resp(200, "{}"), ctx("valid_image", "mmc-ab-0-1-1", "h1"), 10.0)
    _request(
        p,
        _resp(400, "dimensions"),
        ctx("malformed_post", "mmc-ab-0-1-2", "h1", case="dimensions", expected_status=400, endpoint="/v2/embed"),
        11.0,
    )
    _request(
        p,
        _resp(400, "bad type"),
        ctx("malformed_pre", "mmc-ab-0-2-1", "h2", case="content_unknown_type", expected_status=400),
        11.5,
    )
    with open(log, "a") as f:
        f.write(
            "WARNING [core.py:1868] Multi-modal cache miss for request embd-mmc-ab-0-1-3 "
            "(mm_hashes=['0123456789ab']): P0/P1 cache drift; returning a retryable response\n"
        )
    p.read_log(tail)
    [drift] = [e for e in p.state()["events"] if e["event"] == "drift"]
    assert drift["cause"] is None  # the line came before the answer of the request it names
    _request(
        p,
        SimpleNamespace(status_code=0, text="", error=ConnectionRefusedError("refused")),
        ctx("valid_image", "mmc-ab-0-1-3", "h1"),
        12.0,
    )
    assert drift["cause"].startswith("malformed_post/dimensions on /v2/embed (HTTP 400), "), drift
    p.on_health({"t": 13.0, "ok": False, "status": None, "error": "ConnectionRefusedError"})
    [crash] = [e for e in p.state()["events"] if e["event"] == "crash"]
    assert crash["cause"] == drift["cause"]
    [tab] = [t for t in panel_tables.tables(p, p.state()) if t["key"] == panel_tables.TAB_EVENTS]
    assert [r["cause"] for r in tab["data"] if r["event"] in ("drift", "crash")] == [drift["cause"]] * 2


def test_the_panel_names_a_race_of_first_uses_as_the_report_does(tmp_path):
    """No request failed: a batch and a single request carried a new image at once, and the drift line names the
    single one. The panel says what the report says (mmchaos/cause_rule.py), live."""
    p = _panel()
    t0 = time.time() - 60  # the recorder's times are epoch seconds: an answer comes after its request was sent

    def ctx(kind, rid, hashes):
        return {"kind": kind, "request_id": rid, "image_hashes": hashes}

    _request(p, _resp(500, "engine dead"), ctx("batch", "mmc-ab-0-1-1", "h9,h8"), t0)
    body = '{"error": {"message": "Multi-modal processor cache miss.", "code": 503}}'
    _request(p, _resp(503, body), ctx("valid_image", "mmc-ab-0-2-1", "h9"), t0 + 0.0002)
    [drift] = [e for e in p.state()["events"] if e["event"] == "drift"]
    assert drift["cause"].startswith("the image's first use at once with batch (HTTP 500)"), drift
