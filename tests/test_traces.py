"""Traces (issue 13), on the stand-in: a run's trace holds exactly the bytes the server received, each image once;
a replay sends them again in each user's order; a request log converts to a trace and back; a campaign can
replay one; and `mmchaos minimize` shrinks a crashing trial to a reproducer that crashes, resumes and keeps to its
budget. The real engine's answers are pinned in test_minimize_engine.py."""

from __future__ import annotations

import base64
import collections
import hashlib
import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cli_inprocess import mmchaos
from conftest import standin_server
from locust_run import locust, rows
from PIL import Image
from test_campaign_standin import run, write_campaign
from test_reliability import killpg, manifest, reaper  # noqa: F401  (the fixture)

from mmchaos.analysis.results import load_results
from mmchaos.analysis.verdict import verdicts
from mmchaos.harness.minimize import repro_script
from mmchaos.payloads import request_log
from mmchaos.payloads.traces import Trace
from mmchaos.tables import read_table

POISON_CASE = ["--malformed-cases", "dimensions_unsupported"]


def _received(log: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in log.read_text().splitlines()]


def _cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """An ad-hoc run of the default mix (every kind, fresh images, malformed URLs), its trace and what the server
    received."""
    out = tmp_path_factory.mktemp("recorded")
    with standin_server(out / "s.log", "--body-log", str(out / "bodies.txt")) as s:
        r = locust(
            "locustfiles/embeddings.py",
            s.base_url,
            out,
            "--fresh-fraction",
            "0.3",
            "--max-requests",
            "400",
            users=3,
            seconds=60,
        )  # ends at 400 requests, however busy the machine
    assert r.returncode == 0, r.stdout[-2000:]
    return out, Trace.load(out), _received(out / "bodies.txt")


def test_the_trace_is_exactly_what_the_server_received(recorded):
    out, trace, received = recorded
    got = dict(received)
    sent = {trace.requests.at[i, "request_id"]: hashlib.sha256(trace.payload(i)).hexdigest() for i in range(len(trace))}
    assert len(got) > 200 and set(got) <= set(sent)
    assert {rid: sent[rid] for rid in got} == got  # byte for byte, every request the server read
    requests = rows(out)
    assert set(requests["request_id"]) == set(sent)  # one trace entry per row
    kinds = set(trace.requests["kind"])
    assert {"valid_image", "multi_image", "batch", "abort", "malformed_post", "malformed_pre"} <= kinds


def test_each_image_is_stored_once_and_made_again_by_recipe(recorded):
    out, trace, _ = recorded
    images = read_table(out, "trace_images").to_pandas()
    assert images["hash"].is_unique
    forms = collections.Counter(images["form"])
    generated = images[images["form"] == "generated"]
    pages = generated["spec"].map(lambda spec: json.loads(spec)["style"] == "page")
    assert (~pages).sum() == 16 and pages.sum() >= 2  # pool 16 (locust_run), and documents' pages
    assert forms["fresh"] > 10 and forms["derived"] > 0
    assert images.loc[images["form"].isin(["generated", "fresh"]), "data"].isna().all()  # recipes, no bytes
    for h in [*images.loc[images["form"] == "fresh", "hash"][:5], *generated.loc[pages, "hash"][:2]]:
        assert hashlib.sha256(trace.data(h)).hexdigest()[:16] == h


@pytest.mark.integration
def test_a_replay_sends_the_same_bytes_in_each_users_order(recorded, tmp_path):
    out, trace, _ = recorded
    with standin_server(tmp_path / "s.log", "--body-log", str(tmp_path / "bodies.txt")) as s:
        r = locust(
            "locustfiles/replay.py",
            s.base_url,
            tmp_path,
            "--replay",
            str(out),
            "--replay-speed",
            "0",
            users=1,
            seconds=120,
        )
    assert r.returncode == 0, r.stdout[-2000:]
    replayed = rows(tmp_path)
    t = trace.requests
    # every recorded request once; a request recorded with its retries is sent as recorded, attempt by attempt
    assert replayed["request_group"].nunique() == t["request_group"].nunique() == (t["attempt"] == 1).sum()
    recorded = collections.Counter(n for n in t.groupby("request_group").size() if n > 1)
    sizes = collections.Counter(replayed.groupby("request_group").size())
    # (whether this short recording holds a retry depends on the machine's speed: a retry waits out its back-off,
    # ~0.5 s; test_a_log_that_records_its_clients_retries_is_replayed_as_recorded pins it on a log that holds one)
    assert all(sizes[n] >= k for n, k in recorded.items()), (recorded, sizes)
    # rows beyond the recording are retries the replaying client added, as its policy says, of requests the
    # recording holds no retry of (here: the run that recorded them ended before their retry)
    assert (replayed["attempt"] > 1).sum() - (t["attempt"] > 1).sum() == len(replayed) - len(t) >= 0
    original = {hashlib.sha256(trace.payload(i)).hexdigest() for i in range(len(trace))}
    again = {h for _, h in _received(tmp_path / "bodies.txt")}
    assert again <= original and len(again) > 0.9 * len(original)  # the recorded bytes, nothing else
    firsts = replayed[replayed["attempt"] == 1].sort_values(["user_id", "seq"]).groupby("user_id")["kind"].agg(list)
    for lane in trace.lanes():  # each recorded user's requests, in order, as one replay user sent them
        kinds = [k for k, a in zip(t.loc[lane, "kind"], t.loc[lane, "attempt"]) if a == 1]
        assert kinds in list(firsts)


def test_a_replay_of_nothing_says_so_and_exits_2(tmp_path, standin):
    r = locust(
        "locustfiles/replay.py",
        standin.base_url,
        tmp_path,
        "--replay",
        str(tmp_path / "nope.jsonl"),
        users=1,
        seconds=30,
    )
    assert r.returncode == 2 and "no such trace folder or request log" in r.stdout, r.stdout[-2000:]


@pytest.mark.integration
def test_a_request_log_converts_to_a_trace_and_back_byte_for_byte(recorded, tmp_path):
    _, trace, _ = recorded
    n = request_log.write(trace, tmp_path / "traffic.jsonl")
    assert n == len(trace) and any((tmp_path / "traffic.images").iterdir())
    back = request_log.read(tmp_path / "traffic.jsonl")
    assert [back.payload(i) for i in range(len(back))] == [trace.payload(i) for i in range(len(trace))]
    assert list(back.requests["kind"]) == list(trace.requests["kind"])
    r = _cli("trace", "import", str(tmp_path / "traffic.jsonl"), str(tmp_path / "imported"))
    assert r.returncode == 0, r.stderr
    r = _cli("trace", "export", str(tmp_path / "imported"), str(tmp_path / "again.jsonl"))
    assert r.returncode == 0, r.stderr
    strip = [
        {k: v for k, v in json.loads(line).items() if k != "body"}
        for line in (tmp_path / "again.jsonl").read_text().splitlines()
    ]
    assert [d["kind"] for d in strip] == list(trace.requests["kind"])
    again = request_log.read(tmp_path / "again.jsonl")
    assert [again.payload(i) for i in range(len(again))] == [trace.payload(i) for i in range(len(trace))]


def _png(path: Path, colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (96, 64), colour).save(buf, format="PNG")
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _hand_written_log(folder: Path) -> Path:
    """Someone's own traffic, written without mmchaos: a session that gets a 400 for an image (a dimensions its
    model does not support), then another session that sends the same image, as a file path and as a data URL."""
    data = _png(folder / "cat.png", (200, 30, 30))

    def body(url, **extra):
        return {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "a cat"}],
                }
            ],
            **extra,
        }

    lines = [
        {"t": "2026-11-30T10:00:00+00:00", "session": "alice", "body": body("cat.png", dimensions=5), "status": 400},
        {
            "t": "2026-11-30T10:00:01.5+00:00",
            "session": "bob",
            "body": body("data:image/png;base64," + base64.b64encode(data).decode()),
        },
    ]
    log = folder / "production.jsonl"
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return log


@pytest.mark.integration
def test_a_hand_written_request_log_replays_a_poison_then_reuse(tmp_path):
    log = _hand_written_log(tmp_path)
    trace = request_log.read(log)
    assert list(trace.requests["kind"]) == ["malformed_post", "valid_image"]  # read from the log, not given
    assert len(trace.images) == 1  # the file and the data URL are one image
    with standin_server(tmp_path / "s.log", "--crash-after-poison") as s:
        r = locust("locustfiles/replay.py", s.base_url, tmp_path / "out", "--replay", str(log), users=1, seconds=60)
        died = s.exit_code()
    df = rows(tmp_path / "out")
    firsts = df[df["attempt"] == 1].sort_values("t_start")
    assert list(firsts["status"].fillna(0)) == [400, 0] and died == 1, r.stdout[-2000:]
    # the reuse found no server; the client retried it as the OpenAI SDK does (2 retries), in its group
    again = df[df["attempt"] > 1]
    assert len(again) == 2 and set(again["request_group"]) == {firsts["request_id"].iloc[1]}
    # the recorded 1.5 s, as recorded (--replay-speed 1): due 1.5 s apart, and the second not sent before it was due
    assert firsts["t_sched"].diff().iloc[1] == pytest.approx(1.5, abs=0.01)
    assert (firsts["t_start"] >= firsts["t_sched"] - 0.01).all() and firsts["sched_lag_ms"].notna().all()


@pytest.mark.parametrize(
    "line,needle",
    [
        ('{"body": 3}', "'body' must be the request body"),
        ('{"body": {}, "kind": "nope"}', "'kind' must be one of"),
        ('{"body": {}, "status": 999}', "'status' must be an HTTP status"),
        ('{"body": {}, "status": "400"}', "'status' must be an HTTP status (100-599), not '400'"),  # JSON's type
        ('{"body": {}, "t": true}', "'t' must be seconds (a number) or an ISO 8601 time, not True"),
        ('{"body": {}, "case": 3}', "'case' must be a case name (a string), not 3"),
        ('{"body": {}, "bodyy": 1}', "unknown field(s) ['bodyy']"),
        (
            '{"body": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "nope.png"}}]}]}}',
            "image nope.png",
        ),
        ("not json", "not JSON"),
        ('{"body": {}, "retry_of": "zz"}', "'retry_of' must be the request_id of an earlier line"),
        ('{"body": {}, "session": "b", "retry_of": "log-1"}', "names a line of another session"),
    ],
)
def test_a_bad_request_log_is_one_line_naming_the_line(tmp_path, line, needle):
    (tmp_path / "log.jsonl").write_text('{"body": {"input": "ok"}}\n' + line + "\n")
    r = mmchaos("trace", "import", str(tmp_path / "log.jsonl"), str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    [msg] = r.stderr.strip().splitlines()
    assert "log.jsonl:2: " in msg and needle in msg, msg
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_campaign_workload_can_replay_a_request_log(tmp_path):
    _hand_written_log(tmp_path)
    f = write_campaign(
        tmp_path,
        duration=30,
        configs=[{"name": "v030", "flags": ["--crash-after-poison"]}],
        workload={"locustfile": None, "trace": "production.jsonl"},
    )
    r = _cli("campaign", "check", str(f))
    assert r.returncode == 0, r.stderr
    [result] = run(f, tmp_path / "results")
    assert result.status == "completed" and [c.signature for c in result.crashes] == ["detokenizer_assert"]
    sent = read_table(tmp_path / "results" / "standin" / "v030" / "t000", "requests").to_pandas()
    assert (sent["attempt"] == 1).sum() == 2  # the log's two requests (the reuse then retried: nobody answered)


def _replay_campaign(tmp_path: Path, flags: list[str], duration: int = 30) -> Path:
    f = write_campaign(
        tmp_path,
        duration=duration,
        configs=[{"name": "v032", "flags": flags}],
        workload={"locustfile": None, "trace": "production.jsonl"},
    )
    return f


@pytest.mark.integration
def test_a_replayed_log_is_judged_as_a_retrying_client_sees_its_server(tmp_path):
    """A stand-in playing 0.32.0 answers the reuse of a poisoned image with the retryable 503 once: the replay
    retries it as the OpenAI SDK does (a row per attempt, one group), so the verdict is the one the mix gets,
    survives with retryable errors; and the trial, which sent its whole log well before its 30 s, is completed."""
    _hand_written_log(tmp_path)
    [result] = run(_replay_campaign(tmp_path, ["--miss-after-poison"]), tmp_path / "results")
    assert result.status == "completed" and result.error is None, result
    trial = tmp_path / "results" / "standin" / "v032" / "t000"
    sent = read_table(trial, "requests").to_pandas().sort_values("t_start", ignore_index=True)
    assert list(sent["status"]) == [400, 503, 200] and list(sent["attempt"]) == [1, 1, 2]
    assert sent.at[2, "request_group"] == sent.at[1, "request_id"] and list(sent["final"]) == [True, False, True]
    assert manifest(trial)["status"] == "completed" and manifest(trial)["replay"]["complete"]
    assert manifest(trial)["replay"]["sent"] == manifest(trial)["replay"]["requests"] == 2
    results = load_results(tmp_path / "results" / "standin")
    v = verdicts(results).set_index("config").loc["v032"]
    assert v["verdict"] == "retryable" and v["normal_ok"] == "ok", v["evidence"]
    # its load time is the log's (first request to last answer), not Locust's start-up and shutdown around it
    account, [row] = manifest(trial)["replay"], results.trials.to_dict("records")
    assert row["status"] == "completed" and row["t_start"] == account["t_first"]
    assert row["duration_s"] == pytest.approx(account["t_done"] - account["t_first"])
    # bounded by events, not by how long Locust took to start and stop on this machine: the log's time runs from
    # its first request to its last answer, inside the load window
    ends = sent["t_start"] + sent["latency_ms"] / 1000
    assert account["t_first"] <= sent["t_start"].min() and account["t_done"] >= ends.max()
    assert manifest(trial)["t_load_start"] <= account["t_first"] <= account["t_done"] <= manifest(trial)["t_load_end"]


@pytest.mark.integration
def test_a_log_that_records_its_clients_retries_is_replayed_as_recorded(tmp_path):
    """A log that says which line retries which (``retry_of``) is sent as recorded: no retry added to it, its
    attempts one group."""
    data = _png(tmp_path / "cat.png", (200, 30, 30))
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
    lines = [
        {"t": 0, "body": {**body, "dimensions": 5}, "status": 400},  # one session: sent in this order
        {"t": 0.5, "body": body, "status": 503, "request_id": "first"},
        {"t": 1.0, "body": body, "retry_of": "first", "status": 200},
    ]
    log = tmp_path / "retries.jsonl"
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    with standin_server(tmp_path / "s.log", "--miss-after-poison") as s:
        r = locust(
            "locustfiles/replay.py",
            s.base_url,
            tmp_path / "out",
            "--replay",
            str(log),
            "--replay-speed",
            "0",
            users=1,
            seconds=60,
        )
    assert r.returncode == 0, r.stdout[-2000:]
    sent = rows(tmp_path / "out").sort_values("t_start", ignore_index=True)
    assert list(sent["status"]) == [400, 503, 200] and list(sent["attempt"]) == [1, 1, 2]
    assert sent.at[2, "request_group"] == sent.at[1, "request_id"] and list(sent["final"]) == [True, False, True]
    # export keeps the link: the log written back says which line retries which
    again = tmp_path / "again.jsonl"
    request_log.write(Trace.load(tmp_path / "out"), again)
    assert [json.loads(x).get("retry_of") for x in again.read_text().splitlines()] == [
        None,
        None,
        sent.at[1, "request_id"],
    ]


@pytest.mark.integration
def test_a_replay_longer_than_its_duration_is_cut_and_says_what_it_did_not_send(tmp_path):
    body = {"model": "m", "input": "hello"}
    (tmp_path / "production.jsonl").write_text(
        "\n".join(json.dumps(x) for x in [{"t": 0, "body": body}, {"t": 0.5, "body": body}, {"t": 600, "body": body}])
        + "\n"
    )
    [result] = run(_replay_campaign(tmp_path, [], duration=4), tmp_path / "results")
    assert (
        result.status == "completed" and result.error == "replay cut at the 4 s duration: 1 of 3 requests not sent"
    ), result
    trial = tmp_path / "results" / "standin" / "v032" / "t000"
    assert manifest(trial)["replay"]["cut_by_run_time"] and manifest(trial)["replay"]["not_sent"] == 1


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_a_replay_stopped_before_the_end_of_its_log_is_interrupted(tmp_path, reaper, sig):  # noqa: F811
    """A replay stopped early stays interrupted (a re-run does it again): Locust stopped as Ctrl-C stops it
    (SIGINT: it writes what it sent) or dead (SIGKILL: nothing written). Its load time is Locust's."""
    body = {"model": "m", "input": "hello"}
    (tmp_path / "production.jsonl").write_text(
        "\n".join(json.dumps({"t": i * 0.1, "body": body}) for i in range(300)) + "\n"  # 30 s of log
    )
    root = tmp_path / "results"
    trial = root / "standin" / "v032" / "t000"
    stopped = []

    def stop_locust_mid_log(state):
        if not stopped and state.get("phase") == "load" and state.get("requests", 0) >= 20:
            [pgid] = manifest(trial)["locust_pgids"]
            reaper.add(pgid)
            killpg(pgid, sig)
            stopped.append(pgid)

    [result] = run(_replay_campaign(tmp_path, [], duration=60), root, progress=stop_locust_mid_log)
    assert stopped and result.status == "interrupted" and not result.crashes, result
    m = manifest(trial)
    assert m["status"] == "interrupted"
    if sig == signal.SIGINT:  # Locust's orderly stop: it says how much of its log it sent
        assert not m["replay"]["complete"] and not m["replay"]["cut_by_run_time"]
        assert 20 <= m["replay"]["sent"] < m["replay"]["requests"] == 300
        assert result.error.startswith(f"replay stopped before the end of its log ({m['replay']['sent']} of 300 ")
    else:
        assert m["locust_exit_code"] == -signal.SIGKILL and "replay" not in m
    [row] = load_results(root / "standin").trials.to_dict("records")
    assert row["status"] == "interrupted" and row["t_start"] == m["t_load_start"]
    assert row["duration_s"] == pytest.approx(m["t_load_end"] - m["t_load_start"])


# --- minimize ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashed_trial(tmp_path_factory):
    """A trial of a mix with post-render 400s on a small hot pool, on a stand-in that dies as 0.30.0 does. One user:
    the replay sends the trial's requests in the order they left, which is the order the server took them only
    when nothing ran beside them (with three users a loaded machine delivered a reuse before its poison)."""
    tmp = tmp_path_factory.mktemp("minimize")
    # images only (the stand-in's crash is an image's): no video kind, no video in the poisons
    f = write_campaign(
        tmp,
        duration=60,
        configs=[{"name": "v030", "flags": ["--crash-after-poison"]}],
        workload={"users": 1, "spawn_rate": 1},
        options={
            "pool_size": 4,
            "fresh_fraction": 0.0,
            "video_share": 0.0,
            "malformed_cases": "dimensions_unsupported",
        },
        mix={"malformed_pre": 0, "video": 0},
    )
    [result] = run(f, tmp / "results")
    assert result.crashes, "the stand-in did not crash"
    return tmp / "results" / "standin" / "v030" / "t000"


def _minimize(trial: Path, out: Path, *extra: str):
    return _cli(
        "minimize",
        str(trial),
        "--out",
        str(out),
        "--repeats",
        "2",
        "--settle",
        "1",
        "--startup-timeout",
        "30",
        *extra,
        timeout=600,
    )


@pytest.mark.integration
def test_minimize_finds_the_two_requests_and_the_script_reproduces_them(crashed_trial, tmp_path):
    r = _minimize(crashed_trial, tmp_path / "min")
    assert r.returncode == 0, r.stdout + r.stderr
    log = [json.loads(x) for x in (tmp_path / "min" / "minimal.jsonl").read_text().splitlines()]
    # a post-render 400, then its image again (in a valid request, or in an abort the stand-in read before the hang-up)
    urls = [set(re.findall(r'"url": "([^"]+)"', json.dumps(x["body"]))) for x in log]
    assert len(log) == 2 and log[0]["kind"] == "malformed_post" and urls[0] & urls[1], log
    sides = [max(Image.open(f).size) for f in (tmp_path / "min" / "minimal.images").iterdir()]
    assert sides and max(sides) <= 64, sides  # smaller images: the stand-in still dies when one comes again
    issue = (tmp_path / "min" / "issue.md").read_text()
    assert "detokenizer_assert" in issue and "P0/P1 cache drift" in issue and "crashed 2 of 2" in issue
    script = tmp_path / "min" / "repro.py"
    assert "import requests" not in script.read_text() and "mmchaos" not in script.read_text().split('"""')[2]
    for flags, code, says in (
        (["--crash-after-poison"], 1, "crashed"),
        (["--miss-after-poison"], 0, "survived"),
        ([], 0, "survived"),
    ):
        with standin_server(tmp_path / "s.log", *flags) as s:
            p = subprocess.run(
                [sys.executable, str(script), "--url", s.base_url, "--settle", "1"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert p.returncode == code and p.stdout.strip().splitlines()[-1].startswith(says), (flags, p.stdout)
        if flags == ["--miss-after-poison"]:
            assert "-> 503" in p.stdout  # the fixed version's retryable answer, then still up

    # resumable: a second run knows every candidate and starts no server
    again = _minimize(crashed_trial, tmp_path / "min")
    assert again.returncode == 0 and "start " not in again.stderr and "(known)" in again.stderr, again.stderr


@pytest.mark.integration
def test_a_script_that_hung_up_on_a_survivor_says_the_race_may_have_been_lost(tmp_path):
    """A hang-up poisons only when it lands while the image renders: a script whose hang-up came before any answer
    and whose server survived says that one survival is weak evidence; a script without hang-ups does not."""
    log = _hand_written_log(tmp_path)
    first, second = (json.loads(x) for x in log.read_text().splitlines())
    first.pop("status")
    hung = tmp_path / "hung.jsonl"
    hung.write_text(json.dumps({**first, "disconnect_after_ms": 1}) + "\n" + json.dumps(second) + "\n")
    said = {}
    for name, source in (("hung", hung), ("plain", log)):
        trace = request_log.read(source)
        script = tmp_path / f"{name}.py"
        script.write_text(repro_script.render(trace, repro_script.ScriptInfo("t", "a")))
        with standin_server(tmp_path / f"{name}.log", "--delay-ms", "300") as s:  # answers after the hang-up
            p = subprocess.run(
                [sys.executable, str(script), "--url", s.base_url, "--settle", "1"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert p.returncode == 0 and p.stdout.strip().splitlines()[-1].startswith("survived"), p.stdout
        said[name] = p.stdout
    assert request_log.read(hung).requests["kind"].iloc[0] == "abort"
    assert "note: request(s) 1 hung up before an answer" in said["hung"], said["hung"]
    assert "hung up before an answer" not in said["plain"], said["plain"]


@pytest.mark.integration
def test_minimize_keeps_the_recorded_images_when_asked(crashed_trial, tmp_path):
    r = _minimize(crashed_trial, tmp_path / "min", "--repeats", "1", "--keep-images")
    assert r.returncode == 0, r.stdout + r.stderr
    assert " px: " not in r.stderr and "without image" not in r.stderr, r.stderr  # no image was tried smaller
    assert len((tmp_path / "min" / "minimal.jsonl").read_text().splitlines()) == 2


@pytest.mark.integration
def test_minimize_keeps_to_its_budget_and_says_so(crashed_trial, tmp_path):
    r = _minimize(crashed_trial, tmp_path / "min", "--max-starts", "1")
    assert r.returncode == 1 and "stopped after 1 server starts" in r.stderr, r.stdout + r.stderr
    assert len(list((tmp_path / "min" / "runs").iterdir())) == 1
    assert (tmp_path / "min" / "repro.py").is_file()  # the smallest sequence found so far, said to be so


@pytest.mark.integration
def test_minimize_says_when_the_trials_crash_does_not_replay(tmp_path, reaper):  # noqa: F811
    """A crash no request caused (the server SIGKILLed from outside mid-load): no guess and not the whole sequence
    crashes a fresh server, so the search ends there, without spending its budget on ddmin."""
    f = write_campaign(tmp_path, duration=10, configs=[{"name": "killed"}])
    trial = tmp_path / "results" / "standin" / "killed" / "t000"
    killed = []

    def kill_the_server(state: dict) -> None:
        if not killed and state.get("phase") == "load" and state.get("requests", 0) >= 40:
            killed.append(manifest(trial)["server_pgids"][0])
            reaper.add(killed[0])
            killpg(killed[0], signal.SIGKILL)

    [result] = run(f, tmp_path / "results", progress=kill_the_server)
    assert killed and result.crashes
    r = _minimize(trial, tmp_path / "min", "--repeats", "1")
    assert r.returncode == 1 and "did not crash a fresh server when replayed" in r.stderr, r.stdout + r.stderr
    assert "ddmin" not in r.stderr and "the trial's sequence" in r.stderr
    assert "(run it again, or try another crashed trial)" in r.stderr  # not "try --repeats 1": it ran with 1


@pytest.mark.integration
def test_minimize_refuses_what_it_cannot_do(tmp_path, crashed_trial):
    r = _cli("minimize", str(tmp_path))
    assert r.returncode == 2 and "not a trial folder" in r.stderr
    healthy = write_campaign(tmp_path, duration=2, configs=[{"name": "ok"}])
    run(healthy, tmp_path / "results")
    r = _cli("minimize", str(tmp_path / "results" / "standin" / "ok" / "t000"))
    assert r.returncode == 2 and "did not crash" in r.stderr
    r = _cli("minimize", str(crashed_trial), "--repeats", "0")
    assert r.returncode == 2 and "not a positive whole number" in r.stderr


def test_a_log_line_whose_text_holds_a_unicode_line_separator_is_one_line(tmp_path):
    """JSON Lines end at "\\n" only: a text with U+2028 or \\x1c (a hunt drew both) is part of its line."""
    body = {"model": "m", "input": "a\u2028b\x1cc"}
    log = tmp_path / "odd.jsonl"
    log.write_text(json.dumps({"t": 0.0, "body": body}, ensure_ascii=False) + "\n", encoding="utf-8")
    back = request_log.read(log)
    assert len(back) == 1 and json.loads(back.payload(0))["input"] == "a\u2028b\x1cc"
