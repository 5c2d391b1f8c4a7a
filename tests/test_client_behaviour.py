"""Our client behaves like the clients users run, and says who caused each failure (issue 11, on the stand-in):
connections the server closed are not our failures, retries are the OpenAI SDK's, and the run's exit code follows
its gates (the Locust runs of these are in-process, in test_locust_users.py; here: the rules, the README's command
and the web UI's live verdict)."""

from __future__ import annotations

import email.utils
import json
import math
from types import SimpleNamespace

import pytest
import requests as http
from conftest import standin_server
from geventhttpclient.client import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed
from locust_run import locust, only

from mmchaos import retry_policy, schema
from mmchaos.locustfiles.plugin import gates
from mmchaos.locustfiles.plugin.connections import ReconnectingClient
from mmchaos.payloads import bodies
from mmchaos.payloads.generated import generate_pool
from mmchaos.verdict_rule import (
    CLEAN,
    FAILS,
    NOT_EXERCISED,
    NOT_OBSERVED,
    RETRYABLE,
    Counts,
    attempt_counts,
    judge,
)

POISON_CASE = ["--malformed-cases", "dimensions_unsupported"]  # the stand-in answers 400 (the report's trigger)


# --- connections ------------------------------------------------------------------------------------------------


def _bodies():
    image = generate_pool(1, seed=3, preset="small")[0]
    ok = bodies.image_request("m", image, "x").payload()
    file_url = json.dumps(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/hostname"}}]}
            ],
        }
    ).encode()
    return ok, file_url


@pytest.mark.parametrize("client_class", [HTTPClient, ReconnectingClient])
def test_a_connection_closed_after_a_500_is_not_a_failure_of_ours(standin_here, client_class):
    """The stand-in answers a file:// image with 500 and closes the connection without saying so (as vLLM does);
    the next request, sent at once, goes out on that connection before the close is seen."""
    ok, file_url = _bodies()
    with standin_here() as standin:
        _closed_after_a_500(client_class.from_url(standin.base_url, concurrency=1), ok, file_url)


def _closed_after_a_500(client, ok, file_url):
    client_class = type(client)
    headers = {"Content-Type": "application/json"}
    try:
        first = client.request("POST", "/v1/embeddings", body=file_url, headers=headers)
        assert first.status_code == 500 and b"local files" in first.read()  # read: the connection goes back to the pool
        if client_class is HTTPClient:  # the plain client: the request is lost on the dead connection
            with pytest.raises(HTTPConnectionClosed):
                client.request("POST", "/v1/embeddings", body=ok, headers=headers).read()
            return
        r = client.request("POST", "/v1/embeddings", body=ok, headers=headers)
        assert r.status_code == 200 and client.reconnects == 1  # re-sent once, on a fresh connection
    finally:
        client.close()


# --- retries ----------------------------------------------------------------------------------------------------


def test_openai_retry_rule():
    assert retry_policy.should_retry("openai", 0, 503, schema.HTTP_ERROR)
    assert retry_policy.should_retry("openai", 1, None, schema.CONNECTION_ERROR)
    assert retry_policy.should_retry("openai", 0, None, schema.TIMEOUT)
    assert not retry_policy.should_retry("openai", 2, 503, schema.HTTP_ERROR)  # 2 retries at most
    assert not retry_policy.should_retry("openai", 0, 400, schema.HTTP_ERROR)
    assert not retry_policy.should_retry("openai", 0, None, schema.ABORTED)
    assert all(retry_policy.should_retry("openai", 0, s, schema.HTTP_ERROR) for s in (408, 409, 429, 500, 502))
    assert not retry_policy.should_retry("none", 0, 503, schema.HTTP_ERROR)
    assert not retry_policy.should_retry("openai", 0, 500, schema.HTTP_ERROR, {"x-should-retry": "false"})
    assert retry_policy.should_retry("openai", 0, 400, schema.HTTP_ERROR, {"x-should-retry": "true"})
    assert not retry_policy.should_retry("openai", 0, 503, schema.HTTP_ERROR, {"retry-after": "121"})
    # 0.5 s doubling to 8 s, minus up to 25 % jitter; the server's Retry-After within (0, 120] s wins
    assert retry_policy.delay(0, 0.0) == 0.5 and retry_policy.delay(1, 0.0) == 1.0 and retry_policy.delay(5, 0) == 8.0
    assert math.isclose(retry_policy.delay(0, 0.999), 0.5 * (1 - 0.25 * 0.999))
    assert retry_policy.delay(0, 0.5, {"retry-after-ms": "1500"}) == 1.5
    assert retry_policy.delay(0, 0.5, {"retry-after": "3"}) == 3.0


# --- gates and exit codes ---------------------------------------------------------------------------------------


def test_the_readme_headless_run_against_a_healthy_server_exits_0(standin, tmp_path):
    r = locust("locustfiles/embeddings.py", standin.base_url, tmp_path, users=4, seconds=4)
    assert r.returncode == 0, r.stdout[-2000:]
    assert "gate failed" not in r.stdout


def test_gates_evaluate():
    o = SimpleNamespace(max_crashes=0, max_server_error_ratio=0.01, max_p95_ms=0.0)
    c = Counts(valid_groups=200, valid_uncured=1)
    g = gates.evaluate(o, c, crashes=0, p95_ms=120.0)
    assert [x.state for x in g] == [gates.PASSED, gates.PASSED] and gates.exit_code(g) == 0  # p95: no gate
    g = gates.evaluate(o, Counts(valid_groups=100, valid_uncured=2), crashes=1, p95_ms=None)
    assert [x.state for x in g] == [gates.FAILED, gates.FAILED] and gates.exit_code(g) == 1
    assert g[1].text == "valid requests failed by the server after retries 2.00% > --max-server-error-ratio 1.00%"
    g = gates.evaluate(
        SimpleNamespace(max_crashes=0, max_server_error_ratio=1.0, max_p95_ms=500.0),
        Counts(),
        crashes=None,
        p95_ms=None,
    )
    assert [x.state for x in g] == [gates.NOT_CHECKED, gates.NOT_CHECKED] and gates.exit_code(g) == 0


# --- the verdict rule -------------------------------------------------------------------------------------------


def test_the_three_levels():
    up = Counts(health_polls=100)
    valid_ok = attempt_counts("valid_image", None, 200, schema.OK, None, True, False, n=50)
    poison = attempt_counts("malformed_post", None, 400, schema.HTTP_ERROR, 400, True, False, n=5)
    assert judge(up + valid_ok + poison).level == CLEAN
    miss = attempt_counts("valid_image", None, 503, schema.HTTP_ERROR, None, False, True, n=3)
    assert judge(up + valid_ok + poison + miss).level == RETRYABLE  # cured: the retries succeeded
    uncured = attempt_counts("valid_image", None, 503, schema.HTTP_ERROR, None, True, True)
    assert judge(up + valid_ok + poison + uncured).level == FAILS
    assert judge(up + valid_ok + poison + Counts(crashes=1)).level == FAILS
    cut = attempt_counts("valid_image", None, None, schema.CUT, None, True, False, n=9)
    assert cut == Counts()  # in no count
    aborts_only = judge(up + valid_ok + attempt_counts("abort", None, None, schema.ABORTED, None, True, False))
    assert aborts_only.level == CLEAN and aborts_only.checks["fails_alone"][0] == NOT_EXERCISED
    nothing_poisons = judge(up + valid_ok)
    assert nothing_poisons.checks["no_drift"][0] == NOT_EXERCISED and nothing_poisons.level == CLEAN


def test_a_check_whose_evidence_is_in_an_unread_log_is_not_observed_never_ok():
    """A run that reads no server log (locust without --server-log) cannot see drift lines: with poison sent and no
    cache-miss answer, its drift check says it could not observe, and how to let it; the level is unchanged."""
    up = Counts(health_polls=100)
    valid_ok = attempt_counts("valid_image", None, 200, schema.OK, None, True, False, n=50)
    poison = attempt_counts("malformed_post", None, 400, schema.HTTP_ERROR, 400, True, False, n=5)
    blind = judge(up + valid_ok + poison + Counts(logs_unread=1))
    assert blind.checks["no_drift"][0] == NOT_OBSERVED and "--server-log" in blind.checks["no_drift"][1]
    assert blind.level == CLEAN
    assert judge(up + valid_ok + poison).checks["no_drift"][0] == "ok"  # a log read, nothing in it
    miss = attempt_counts("valid_image", None, 503, schema.HTTP_ERROR, None, False, True)
    assert judge(up + valid_ok + poison + miss + Counts(logs_unread=1)).checks["no_drift"][0] == "failed"


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,level",
    [
        ([], CLEAN),
        (["--miss-after-poison"], RETRYABLE),
        (["--die-after", "30"], FAILS),
    ],
)
def test_the_live_verdict_on_the_web_ui_state(tmp_path, args, level):
    from test_webui import LocustUI, run_finished_and_flushed, wait_for

    with standin_server(tmp_path / "s.log", *args) as s:
        # one user: no second poisoning of an image overtakes a retry (see test_a_cache_miss_is_retried_...)
        # ends at its request budget (after a crash: refusals without a pause), however busy the machine
        ui = LocustUI(
            tmp_path,
            "--host",
            s.base_url,
            "--autostart",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            "120s",
            "--max-requests",
            "45",
            "--refused-backoff-ms",
            "0",
            "--autoquit",
            "60",
            "--results-dir",
            str(tmp_path),
            "--image-preset",
            "small",
            "--pool-size",
            "2",
            "--fresh-fraction",
            "0",
            *only(valid_image=3, malformed_post=1),
            *POISON_CASE,
        ).wait_up()
        try:
            st, _ = wait_for(lambda: run_finished_and_flushed(ui, tmp_path), 150, "the run to end")
            page = http.get(ui.url + "/mmchaos/timeline", timeout=5)
        finally:
            ui.stop()
    assert st["verdict"]["level"] == level, st["verdict"]
    assert {g["option"] for g in st["gates"]} == {"max_crashes", "max_server_error_ratio", "max_wrong_answers"}
    assert page.status_code == 200 and "<svg" in page.text


def test_retry_after_as_an_http_date_is_honoured_as_the_sdk_does(monkeypatch):
    """RFC 9110 lets Retry-After be a date; the OpenAI SDK waits until it (within its 120 s), and so do we."""
    now = 1_800_000_000.0
    in_30s = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_policy.retry_after({"retry-after": in_30s}, now=now) == 30.0
    # the rule reads the date against the clock: a clock that stands still, so that no pause of a busy machine
    # between writing the date and reading it moves the answer
    monkeypatch.setattr(retry_policy, "time", SimpleNamespace(time=lambda: now))
    in_an_hour = email.utils.formatdate(now + 3600, usegmt=True)
    assert not retry_policy.should_retry("openai", 0, 503, schema.HTTP_ERROR, {"retry-after": in_an_hour})
    soon = email.utils.formatdate(now + 5, usegmt=True)
    assert retry_policy.delay(0, 0.5, {"retry-after": soon}) == 5.0
    assert retry_policy.retry_after({"retry-after": "not a date"}) is None


def test_the_hang_up_client_hangs_up_on_a_slow_answer_and_takes_a_quick_one(standin_here):
    from mmchaos.hang_up import hang_up

    body = json.dumps({"model": "m", "input": "a photo"}).encode()
    headers = {"Content-Type": "application/json"}
    with standin_here("--delay-ms", "2000") as slow:
        got = hang_up(slow.base_url, "/v1/embeddings", body, headers, after_s=0.05)
    assert got.hung_up and got.status is None and got.ms < 2000, got  # it did not wait for the answer
    with standin_here() as quick:
        got = hang_up(quick.base_url, "/v1/embeddings", body, headers, after_s=30, connect_s=5)
    assert got.status == 200 and not got.hung_up and json.loads(got.text)["data"], got
