"""From a crash to a bug report, on real vLLM (issue 13): the demo's crashing 0.30.0 trial shrinks to at most three
requests whose standalone script crashes a fresh 0.30.0 default server (the minimizer's confirmation runs it), not
one with the cache off, and not 0.32.0, which stays up (answering the reuse with the retryable 503 when the poison
took); a crash provoked by client aborts alone keeps an abort; and a request log written by hand (no mmchaos
generator) replays into the crash."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import campaign_toml
import pytest
from conftest import REPORT_VERSION, require_engine_and_model
from PIL import Image

from mmchaos import paths, schema
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.harness.minimize.repro_script import parse_result
from mmchaos.tables import read_table

pytestmark = pytest.mark.engine
RACE_TRIES = 3  # fresh tries of a sequence whose crash depends on a hang-up's race, before the test fails
SETTLE = "5"  # seconds a candidate's server is watched after its last request (0.30.0 dies within ~1 s)


def _minimize(
    trial: Path, out: Path, max_starts: int = 12, budget_may_end_it: bool = False, hang_up_may_lose: bool = False
):
    """The minimal sequence (exit 0); with ``budget_may_end_it``, also the smallest found when the start budget ran
    out (exit 1, said so). With ``hang_up_may_lose``, a trial's sequence with a client hang-up that did not crash
    when replayed returns None: a hang-up poisons only if it lands while the image renders, a race a loaded machine
    loses (harness/minimize/repro.py); the caller tries again on fresh servers. Images kept as recorded: shrinking
    them costs starts and is pinned on the stand-in (test_traces.py)."""
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mmchaos.harness.cli",
            "minimize",
            str(trial),
            "--out",
            str(out),
            "--repeats",
            "1",
            "--settle",
            SETTLE,
            "--max-starts",
            str(max_starts),
            "--keep-images",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=1500)
    finally:
        if p.poll() is None:  # SIGTERM: it stops the candidate server it runs, and removes its temp folder
            p.terminate()
            p.communicate(timeout=120)
    spent = budget_may_end_it and p.returncode == 1 and f"stopped after {max_starts} server starts" in stderr
    sequence = (
        [json.loads(line) for line in (out / "minimal.jsonl").read_text().splitlines()]
        if (out / "minimal.jsonl").is_file()
        else []
    )
    if (
        hang_up_may_lose
        and p.returncode == 1
        and "did not crash a fresh server when replayed" in stderr
        and any(r.get("disconnect_after_ms") is not None for r in sequence)
    ):
        return None
    assert p.returncode == 0 or spent, stdout + stderr[-4000:]
    return sequence


def _crashed_a_fresh_server(out: Path) -> bool:
    """Whether one of the search's own runs of the final repro.py (each on a fresh server) crashed."""
    script = (out / "repro.py").read_text()
    return any(
        (run / "repro.py").read_text() == script
        and (parse_result((run / "repro.out").read_text()) or {}).get("crashed")
        for run in sorted((out / "runs").iterdir())
        if (run / "repro.out").is_file()
    )


def _script(script: Path, server):
    return subprocess.run(
        [sys.executable, str(script), "--url", server.base_url, "--settle", SETTLE],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.timeout(2400)  # the demo campaign (when this test starts the session's), then a server start a candidate
def test_the_demo_crash_shrinks_to_a_script_that_crashes_only_the_affected_server(
    demo_campaign, workaround_server, fixed_server, tmp_path
):
    camp_dir, results = demo_campaign
    assert results["v0.30-default"].crashes, "the demo's 0.30.0 default trial did not crash"
    out = tmp_path / "min"
    for attempt in range(RACE_TRIES):  # each on fresh servers: a hang-up's race is won or lost anew
        sequence = _minimize(camp_dir / "v0.30-default" / "t000", out, hang_up_may_lose=True)
        if sequence is not None:
            break
        out = tmp_path / f"min-{attempt + 1}"
    else:
        pytest.fail(
            f"the crashed trial's requests, a client hang-up among them, did not crash a fresh server when replayed, "
            f"{RACE_TRIES} times: the hang-up lost its race each time on this machine"
        )
    assert sequence is not None
    assert 2 <= len(sequence) <= 3, sequence  # the known minimum: a post-render failure, then the same image
    # the failure as its case was built to get it (a 400, or the 500 of truncate_zero); an abort has no status
    first = sequence[0]
    assert first["kind"] in ("malformed_post", "abort"), sequence
    assert first.get("status") == first.get("expected_status"), sequence
    issue = (out / "issue.md").read_text()
    assert "0.30.0" in issue and "detokenizer_assert" in issue and "detokenizer is not None" in issue
    script = out / "repro.py"

    # exit 0 is "confirmed": the search's last start ran repro.py itself against a fresh 0.30.0 default server
    confirm = sorted((out / "runs").iterdir())[-1]
    said = (confirm / "repro.out").read_text()
    assert (confirm / "repro.py").read_text() == script.read_text()
    assert parse_result(said)["crashed"] and "\ncrashed: " in said, said
    assert "detokenizer is not None" in (confirm / "server.log").read_text()

    survived = _script(script, workaround_server)
    assert survived.returncode == 0 and "survived" in survived.stdout.splitlines()[-1], survived.stdout

    fixed = _script(script, fixed_server)  # the session's 0.32.0: the script's images are new to it
    assert fixed.returncode == 0 and fixed_server.health()[0], fixed.stdout
    # the drift reached 0.32.0 and was answered 503: certain after a post-render 400; after a hang-up only when it
    # landed while the image rendered (13 of 16 on 0.32.0, harness/minimize/repro.py); when it did not, the reuse got a
    # 200 and the script says that this survival is weak evidence
    raced = sequence[0]["kind"] == "abort" and "hung up before an answer" in fixed.stdout
    assert "-> 503" in fixed.stdout or raced, fixed.stdout


def _campaign(
    tmp_path: Path, *, duration: int = 60, users: int = 4, trace: str | None = None, **sections: dict
) -> Path:
    """One 0.30.0 default configuration, stopped at its first crash: the mix (its ``mix`` and ``options``) or a
    ``trace`` replayed."""
    return campaign_toml.write_campaign(
        tmp_path / "c.toml",
        campaign={"name": "engine-trace", "target": "engine", "seed": 3, "command": None},
        workload={"locustfile": None, "users": users, "spawn_rate": users, "duration": duration, "trace": trace},
        crash={"startup_timeout": 420},
        configs=[{"name": "v0.30-default", "engine": REPORT_VERSION}],
        **sections,
    )


@pytest.mark.timeout(1800)
def test_a_crash_of_aborts_alone_keeps_an_abort(tmp_path):
    require_engine_and_model(REPORT_VERSION)
    # An abort poisons only an image new to the server, and only if the body is in before the hang-up and the hang-up
    # comes while the image is rendered: small images, hanging up after 1 ms (at 40 ms two users ran 60 s uncrashed),
    # and 40 images, so that many first sendings are aborts (6 realistic images: one run sent 4,393 requests uncrashed)
    f = _campaign(
        tmp_path,
        mix={
            "valid_image": 2,
            "abort": 2,
            "text": 0,
            "multi_image": 0,
            "batch": 0,
            "tokenize": 0,
            "malformed_pre": 0,
            "malformed_post": 0,
            **dict.fromkeys([*schema.ROUTE_KINDS, "document"], 0),  # each would thin the aborts out
        },
        options={"pool_size": 40, "zipf": 0, "fresh_fraction": 0.0, "abort_after_ms": 1},
        users=2,
    )  # two users: fewer requests overlap before the crash, fewer for the search to take apart
    [result] = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    assert result.crashes, "aborts alone did not crash 0.30.0 within the trial"
    # A hang-up poisons only when it lands while the image renders; on a loaded machine that race is often lost
    # (in one CI run four 2-request guesses, an abort and its image again, survived on fresh servers while the
    # 68-request trial crashed), so the search may run out of starts: then its smallest crashing sequence counts
    trial = tmp_path / "results" / "engine-trace" / "v0.30-default" / "t000"
    sequence = _minimize(trial, tmp_path / "min", max_starts=10, budget_may_end_it=True)
    rows, [t_crash] = read_table(trial, "requests").to_pandas(), read_table(trial, "crashes")["t_detected"].to_pylist()
    before = int((rows["t_start"] <= t_crash).sum())  # the search's starting sequence
    assert "abort" in [x["kind"] for x in sequence] and len(sequence) < before, (before, sequence)
    assert _crashed_a_fresh_server(tmp_path / "min")


def test_a_hand_written_request_log_reproduces_the_crash(tmp_path):
    """Someone's production log, written without mmchaos: a 400 for `dimensions` on an image, then the image
    again (as a file path); replayed as a campaign's workload against 0.30.0 with default flags."""
    require_engine_and_model(REPORT_VERSION)
    buf = io.BytesIO()
    Image.new("RGB", (320, 240), (30, 120, 200)).save(buf, format="JPEG", quality=90)
    (tmp_path / "photo.jpg").write_bytes(buf.getvalue())
    model = str(paths.default_model_dir())

    def body(url, **extra):
        return {
            "model": model,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "a photo"}],
                }
            ],
            **extra,
        }

    lines = [
        {"t": 0, "session": "web-1", "body": {"model": model, "input": "hello"}},
        {"t": 1.0, "session": "web-1", "body": body("photo.jpg", dimensions=5), "status": 400},
        {
            "t": 2.0,
            "session": "web-2",
            "body": body("data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()),
        },
    ]
    (tmp_path / "production.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    f = _campaign(tmp_path, trace="production.jsonl", duration=30)
    [result] = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    assert [c.signature for c in result.crashes] == ["detokenizer_assert"], result
