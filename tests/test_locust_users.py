"""The Locust users in this process (Locust's Environment and a local runner, as Locust's own tests run them)
against a stand-in served from this process: one row per request, kinds by weight, aborts, refusals, think time;
our client against connections the server closed, the OpenAI SDK's retries, requests cut by the end of a run, and
the gates that make the exit code. Each run ends at its request budget (--max-requests), however busy the machine.
"""

from __future__ import annotations

import logging
import socket

import pandas as pd
from locust_run import only

from mmchaos import schema
from mmchaos.options import WEIGHTS
from mmchaos.payloads import routes

FILE_URL_CASE = ["--malformed-cases", "image_file_url_not_allowed"]  # the stand-in answers 500 and closes
POISON_CASE = ["--malformed-cases", "dimensions_unsupported"]  # the stand-in answers 400 (the report's trigger)


def _gate_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mmchaos" and "gate failed" in r.getMessage()]


# --- rows -------------------------------------------------------------------------------------------------------


def test_a_run_records_exactly_one_row_per_request(inprocess_locust, standin_here, tmp_path):
    with standin_here() as s:
        run = inprocess_locust.run("embeddings", s.base_url, tmp_path, users=4, max_requests=200)
    assert run.exit_code == 0  # a healthy server: every gate holds
    df = run.rows()
    assert len(inprocess_locust.locust_rows(df)) == run.requests > 0
    assert set(df["outcome"]) <= set(schema.OUTCOMES)
    assert df["t_start"].notna().all() and df["latency_ms"].notna().all()
    assert (df.groupby(["worker", "user_id"])["seq"].apply(lambda s: sorted(s) == list(range(1, len(s) + 1)))).all()
    img = df[df["kind"] == "valid_image"]
    assert img["image_hashes"].str.len().eq(16).all() and (img["n_images"] == 1).all()
    health = run.table("health")
    assert len(health) >= 1 and health["ok"].all()  # polled from the start of the run (every 0.25 s)


def test_think_time_spaces_each_users_requests(inprocess_locust, standin_here, tmp_path):
    """--wait-ms W: a pause uniform in [0, W] ms after each request, every user going on (mean W / 2)."""
    with standin_here() as s:
        run = inprocess_locust.run("embeddings", s.base_url, tmp_path, "--wait-ms", "200", users=2, max_requests=40)
    df = inprocess_locust.locust_rows(run.rows()).sort_values("t_start")
    # the pause: from a request's answer to the user's next request (the answer's own time is the machine's)
    answered = df["t_start"] + df["latency_ms"] / 1000
    gaps = (df["t_start"] - answered.groupby(df["user_id"]).shift()).dropna()
    assert df.groupby("user_id").size().min() >= 10  # both users went on, neither stuck
    # uniform in [0, 0.2] s (quartiles 0.05, 0.1, 0.15): pauses were taken (no think time: all near 0), none much
    # over W; quartiles, not the median's second decimal, which a loaded machine moves (seen: 0.056)
    assert gaps.quantile(0.75) > 0.075 and gaps.quantile(0.9) < 0.5, gaps.describe()


def test_kinds_follow_their_weights(inprocess_locust, standin_here, tmp_path):
    """Every kind at its default weight, each route kind on the routes the server's /openapi.json lists."""
    weights = {k: w for k, (w, _) in WEIGHTS.items()}
    listed = ["/v2/embed", "/pooling", "/score", "/v1/rerank", "/v2/rerank"]  # not /v1/score, not /rerank
    with standin_here("--routes", ",".join(listed)) as s:
        run = inprocess_locust.run(
            "embeddings", s.base_url, tmp_path, "--abort-after-ms", "2000", users=6, max_requests=600
        )
    df = run.rows()
    n = len(df)
    assert n >= 600
    routed = df[df["kind"].isin(routes.ROUTE_KINDS)]
    assert set(routed["endpoint"]) == set(listed) and (routed["outcome"] == "ok").all()
    assert (df.loc[df["kind"].isin(["score", "rerank"]), "n_images"] == routes.DOCUMENTS).all()
    total = sum(weights.values())
    for kind, w in weights.items():
        p = w / total
        share = (df["kind"] == kind).mean()
        tol = 4 * (p * (1 - p) / n) ** 0.5 + 0.005  # four standard errors
        assert abs(share - p) <= tol, (kind, share, p, tol)


def test_without_a_readable_api_the_route_kinds_are_not_sent(inprocess_locust, standin_here, tmp_path, caplog):
    with standin_here() as s:  # no /openapi.json: 404
        run = inprocess_locust.run("embeddings", s.base_url, tmp_path, users=2, max_requests=60)
    assert run.exit_code == 0
    assert set(run.rows()["endpoint"]) <= {"/v1/embeddings", "/tokenize"}
    said = [r.getMessage() for r in caplog.records if "openapi.json" in r.getMessage()]
    assert len(said) == 1 and "route kinds (embed_v2, pooling, score, rerank) are not sent" in said[0]


def test_aborts_are_rows_with_outcome_aborted(inprocess_locust, standin_here, tmp_path):
    with standin_here("--delay-ms", "150") as s:
        run = inprocess_locust.run(
            "embeddings",
            s.base_url,
            tmp_path,
            *only(valid_image=1, abort=3),
            "--abort-after-ms",
            "30",
            users=4,
            max_requests=60,
        )
    df = run.rows()
    assert len(inprocess_locust.locust_rows(df)) == run.requests
    aborts = df[df["kind"] == "abort"]
    assert len(aborts) > 20
    assert (aborts["outcome"] == schema.ABORTED).mean() > 0.9
    assert aborts.loc[aborts["outcome"] == schema.ABORTED, "status"].isna().all()
    answered = inprocess_locust.locust_rows(df)  # the last valid request may be cut by the end of the run
    assert (answered.loc[answered["kind"] == "valid_image", "outcome"] == schema.OK).mean() > 0.9


def test_refused_connections_are_rows(inprocess_locust, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    # no retries, no pause after a refusal: the backoffs would make this test wait, not test more
    run = inprocess_locust.run(
        "embeddings",
        f"http://127.0.0.1:{port}",
        tmp_path,
        "--model",
        "m",
        "--retry-policy",
        "none",
        "--refused-backoff-ms",
        "0",
        users=2,
        max_requests=200,
    )
    df = run.rows()
    assert len(inprocess_locust.locust_rows(df)) == run.requests > 0
    assert (inprocess_locust.locust_rows(df)["outcome"] == schema.CONNECTION_ERROR).all()
    assert len(df) <= 200  # the request budget bounds the loop


# --- connections, retries, cut requests -------------------------------------------------------------------------


def test_a_500_then_valid_requests_on_the_same_user_give_no_connection_error(inprocess_locust, standin_here, tmp_path):
    # no retries: the next request follows the 500 at once (a retry would wait 0.5 s and find the close)
    with standin_here() as s:
        run = inprocess_locust.run(
            "embeddings",
            s.base_url,
            tmp_path,
            *only(valid_image=1, malformed_pre=1),
            *FILE_URL_CASE,
            "--retry-policy",
            "none",
            users=2,
            max_requests=80,
        )
    df = inprocess_locust.locust_rows(run.rows())
    assert run.exit_code == 0
    pre = df[df["kind"] == "malformed_pre"]
    assert len(pre) > 10 and (pre["status"] == 500).all() and (pre["cause"] == schema.CLIENT).all()
    assert (df["outcome"] != schema.CONNECTION_ERROR).all(), df[df["outcome"] == schema.CONNECTION_ERROR]
    assert df["reconnects"].sum() > 0  # the race happened, and was handled
    assert (df.loc[df["kind"] == "valid_image", "outcome"] == schema.OK).all()
    assert len(df) == run.requests


def _cache_misses(inprocess_locust, standin_here, tmp_path, policy, caplog):
    """The stand-in plays vLLM 0.32: a poisoned image is answered once with the retryable 503. An abort the server
    answers before the client hangs up is retried like any other request (the SDK's timeout is per attempt). One
    user, so that no second poisoning of the same image overtakes a retry."""
    with standin_here("--miss-after-poison") as s, caplog.at_level(logging.ERROR, logger="mmchaos"):
        run = inprocess_locust.run(
            "embeddings",
            s.base_url,
            tmp_path,
            *only(valid_image=3, malformed_post=1, abort=1),
            *POISON_CASE,
            "--pool-size",
            "2",
            "--fresh-fraction",
            "0",
            "--retry-policy",
            policy,
            users=1,
            max_requests=80,
        )
    return run, inprocess_locust.locust_rows(run.rows())


def test_a_cache_miss_is_retried_as_the_openai_sdk_does(inprocess_locust, standin_here, tmp_path, caplog):
    run, df = _cache_misses(inprocess_locust, standin_here, tmp_path, "openai", caplog)
    misses = df[df["status"] == 503]
    assert len(misses) > 3
    assert (misses["cause"] == schema.SERVER).all() and (misses["kind"] == "abort").any()
    assert not misses["final"].any()  # each was followed by a retry
    retried = df[df["request_group"].isin(misses["request_group"])]
    last = retried.loc[retried.groupby("request_group")["attempt"].idxmax()]
    ended = last[last["final"]]  # the others: the run ended during their backoff
    assert len(ended) > 3 and (ended["status"] == 200).all() and (ended["attempt"] == 2).all()
    assert (df.groupby("request_group")["seq"].count() <= 3).all()
    # the back-off: from an attempt's answer to the next attempt, 0.5 s minus up to 25 % jitter (a busy machine
    # only lengthens it; the answer's own time is the machine's)
    retried = retried.sort_values("attempt")
    answered = retried["t_start"] + retried["latency_ms"] / 1000
    gaps = (retried["t_start"] - answered.groupby(retried["request_group"]).shift()).dropna()
    assert (gaps >= 0.375).all() and (gaps < 2).all(), gaps.describe()
    assert run.exit_code == 0  # every valid request succeeded in the end


def test_without_retries_a_cache_miss_fails_the_run(inprocess_locust, standin_here, tmp_path, caplog):
    run, df = _cache_misses(inprocess_locust, standin_here, tmp_path, "none", caplog)
    assert len(df[df["status"] == 503]) > 3
    assert (df["attempt"] == 1).all() and df["final"].all()
    assert run.exit_code == 1
    assert any(
        line.startswith("mmchaos: gate failed: valid requests failed by the server") for line in _gate_lines(caplog)
    )


def test_the_budget_ends_the_run_once_the_requests_in_flight_are_answered(inprocess_locust, standin_here, tmp_path):
    """Three users' first requests take 0.3 s; the first to be answered sends the budget's last, the next to be
    answered finds the budget spent: the run ends when that last request has its answer, not before (quitting then
    cut it)."""
    with standin_here("--delay-ms", "300") as s:
        run = inprocess_locust.run("embeddings", s.base_url, tmp_path, *only(text=1), users=3, max_requests=4)
    df = run.rows()
    assert len(df) == run.requests == 4
    assert (df["outcome"] == schema.OK).all(), df["outcome"].value_counts()


def test_requests_cut_by_the_end_of_the_run_are_rows_but_no_failures(inprocess_locust, standin_here, tmp_path):
    """Every request takes 1.5 s; once three have been answered, the runner quits (as at its run time) while the
    three users' next requests are out."""
    with standin_here("--delay-ms", "1500") as s:
        run = inprocess_locust.run(
            "embeddings",
            s.base_url,
            tmp_path,
            *only(text=1),
            users=3,
            max_requests=100,
            quit_when=lambda env: env.mmchaos.sent >= 6 and env.mmchaos.in_flight == 3,
        )
    df = run.rows()
    cut = df[df["outcome"] == schema.CUT]
    assert len(cut) == 3 and (df["outcome"] == schema.OK).sum() == 3
    assert (cut["cause"] == schema.HARNESS).all() and cut["status"].isna().all()
    assert len(df) - len(cut) == run.requests  # not Locust requests
    assert run.exit_code == 0  # a healthy server: nothing failed


def test_a_bad_request_left_unanswered_is_a_timeout_of_the_server(inprocess_locust, standin_here, tmp_path):
    """Locust's catch_response replaces a failed request's error by the failure text: the row must still say
    what happened on the wire."""
    with standin_here("--delay-ms", "1500") as s:
        run = inprocess_locust.run(
            "embeddings",
            s.base_url,
            tmp_path,
            *only(malformed_post=1),
            *POISON_CASE,
            "--request-timeout",
            "0.5",
            "--retry-policy",
            "none",
            users=2,
            max_requests=6,
        )
    df = inprocess_locust.locust_rows(run.rows())
    assert len(df) >= 4 and (df["outcome"] == schema.TIMEOUT).all() and (df["cause"] == schema.SERVER).all()


# --- run state --------------------------------------------------------------------------------------------------


def _first_kinds(df) -> dict[int, list[str]]:
    """Each user's kinds in the order it built its requests (first attempts: retries are the client's)."""
    first = df[df["attempt"] == 1].sort_values("seq")
    return {int(u): list(g["kind"]) for u, g in first.groupby("user_id")}


def test_two_environments_of_one_process_share_no_run_state(inprocess_locust, standin_here, tmp_path):
    """Each Environment has its run state (environment.mmchaos, made at its init): two runs of one process, one
    after the other, the first one's Environment kept. Each counts its own requests (its panel, its budget), its
    users are numbered from 0 (so a seed gives each user the same requests in both), and the first one's state
    is not touched by the second run (its listeners left Locust's events at its quit; Locust's own stats of the
    first, whose listener stays on the events both Environments share, count the second run's requests too)."""
    with standin_here() as s:
        a = inprocess_locust.run("embeddings", s.base_url, tmp_path / "a", "--seed", "5", users=3, max_requests=60)
        a_state, a_requests = a.environment.mmchaos, a.requests
        a_attempts = a_state.live.panel.counts().attempts
        b = inprocess_locust.run("embeddings", s.base_url, tmp_path / "b", "--seed", "5", users=3, max_requests=90)
    b_state = b.environment.mmchaos
    assert a_state is not b_state and a_state.live is not b_state.live and a_state.cut_hook is not b_state.cut_hook
    assert (a_state.sent, b_state.sent) == (60, 90)  # each its own budget
    # each panel counted its own run's requests, and the first kept its count through the second run
    assert a_state.live.panel.counts().attempts == a_attempts == a_requests
    assert b_state.live.panel.counts().attempts == b.requests
    rows_a, rows_b = inprocess_locust.locust_rows(a.rows()), inprocess_locust.locust_rows(b.rows())
    assert (len(rows_a), len(rows_b)) == (a_requests, b.requests)
    assert rows_a["run_id"].nunique() == rows_b["run_id"].nunique() == 1
    assert set(rows_a["run_id"]).isdisjoint(rows_b["run_id"])
    kinds_a, kinds_b = _first_kinds(a.rows()), _first_kinds(b.rows())
    assert set(kinds_a) == set(kinds_b) == {0, 1, 2}  # each run's users numbered from 0
    for user, seq in kinds_a.items():  # the same seed, the same requests per user (as far as both went)
        n = min(len(seq), len(kinds_b[user]))
        assert seq[:n] == kinds_b[user][:n], user


# --- gates and exit codes ---------------------------------------------------------------------------------------


def test_a_crash_fails_the_run_and_says_which_gate(inprocess_locust, standin_here, tmp_path, caplog):
    with standin_here("--die-after", "60") as s, caplog.at_level(logging.ERROR, logger="mmchaos"):
        run = inprocess_locust.run("embeddings", s.base_url, tmp_path, users=3, max_requests=90)
        assert s.died
    assert run.exit_code == 1
    assert "mmchaos: gate failed: crashes 1 > --max-crashes 0" in _gate_lines(caplog)


def test_a_p95_gate(inprocess_locust, standin_here, tmp_path, caplog):
    with standin_here() as s, caplog.at_level(logging.ERROR, logger="mmchaos"):
        run = inprocess_locust.run(
            "embeddings", s.base_url, tmp_path, *only(text=1), "--max-p95-ms", "0.001", users=2, max_requests=40
        )
        assert run.exit_code == 1
        assert any("gate failed: p95 latency of valid requests" in line for line in _gate_lines(caplog))
        run = inprocess_locust.run(
            "embeddings", s.base_url, tmp_path / "b", *only(text=1), "--max-p95-ms", "60000", users=2, max_requests=40
        )
    assert run.exit_code == 0


# --- the probes -------------------------------------------------------------------------------------------------


def test_the_probes_send_each_sequence_step_by_step_each_step_a_row(inprocess_locust, standin_here, tmp_path):
    """The stand-in plays 0.32.0 (a poisoned image is answered once with the retryable 503) and takes 100 ms per
    request, so the abort step hangs up before its answer. One user runs the three sequences in turn."""
    with standin_here("--miss-after-poison", "--delay-ms", "100") as s:
        run = inprocess_locust.run("probes", s.base_url, tmp_path, "--abort-after-ms", "20", users=1, max_requests=8)
    df = inprocess_locust.locust_rows(run.rows()).sort_values(["t_start"])
    assert (df["kind"] == "probe").all()
    steps = {
        seq: list(zip(g["case"], g["status"].astype("Int64"), g["outcome"]))
        for seq, g in df.groupby("probe", sort=False)
    }
    assert steps["poison_reuse"][:3] == [
        ("poison", 400, schema.HTTP_ERROR),
        ("reuse", 503, schema.HTTP_ERROR),
        ("reuse", 200, schema.OK),
    ]  # the miss, then the SDK's retry
    assert steps["tokenize_reuse"][:2] == [("tokenize", 200, schema.OK), ("reuse", 200, schema.OK)]
    (abort_case, abort_status, abort_outcome), reuse = steps["abort_reuse"][0], steps["abort_reuse"][1]
    assert (abort_case, abort_outcome) == ("abort", schema.ABORTED) and abort_status is pd.NA
    assert reuse == ("reuse", 200, schema.OK)
    first_round = df.iloc[:7]  # one sequence of each: 3 + 2 + 2 rows
    assert first_round.groupby("probe")["image_hashes"].nunique().eq(1).all()  # one image per sequence...
    assert first_round["image_hashes"].nunique() == 3  # ... never seen before


def test_routes_asked_for_and_not_listed_by_the_server_are_not_sent(inprocess_locust, standin_here, tmp_path, caplog):
    with standin_here("--routes", "/v2/embed,/score") as s:
        run = inprocess_locust.run(
            "embeddings",
            s.base_url,
            tmp_path,
            *only(valid_image=1, embed_v2=2, rerank=2),
            "--routes",
            "/v2/embed,/rerank",
            users=2,
            max_requests=80,
        )
    assert run.exit_code == 0
    sent = set(run.rows()["endpoint"]) - {"/v1/embeddings", "/tokenize"}
    assert sent == {"/v2/embed"}  # /rerank is not listed, /score was not asked for
    said = [r.getMessage() for r in caplog.records if "--routes" in r.getMessage()]
    assert said == ["mmchaos: --routes: /rerank not listed by the server's /openapi.json: not sent"]
