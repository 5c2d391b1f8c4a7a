"""The demo campaign against the real engines is the ground truth of the verdicts (issues 11 and 3-5): vLLM 0.30.0
with default flags fails, its workarounds (--mm-processor-cache-gb 0, --mm-processor-cache-type shm) are clean,
0.32.0 survives with retryable errors. The campaign is campaigns/demo.toml itself, with one trial per
configuration; every answer below is what the report and `mmchaos report --expect` say about it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from locust_run import locust_rows

from mmchaos import schema
from mmchaos.analysis.report import write_report
from mmchaos.tables import read_table

pytestmark = pytest.mark.engine
EXPECTED = {"v0.30-default": "fails", "v0.30-cache-off": "clean", "v0.30-shm": "clean", "v0.32-default": "retryable"}


@pytest.fixture(scope="module")
def demo(demo_campaign):
    return demo_campaign


def _trial(camp_dir, config):
    d = camp_dir / config / "t000"
    return d, json.loads((d / schema.MANIFEST).read_text())


def test_the_verdicts_are_the_ground_truth(demo, tmp_path):
    camp_dir, results = demo
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(EXPECTED, "completed")
    out = write_report(camp_dir, out_dir=tmp_path / "report")
    assert out.verdicts == EXPECTED, (tmp_path / "report" / "report.md").read_text()[:6000]


def test_the_report_version_crashes_and_the_crash_is_classified(demo):
    camp_dir, _ = demo
    d, manifest = _trial(camp_dir, "v0.30-default")
    crashes = read_table(d, "crashes").to_pandas()
    assert len(crashes) == 1 and crashes["signature"].iloc[0] == "detokenizer_assert"
    assert manifest["t_load_start"] < crashes["t_detected"].iloc[0] <= manifest["t_load_end"]  # provoked by its load
    events = read_table(d, "log_events").to_pandas()
    assert "cache_drift" in set(events["signature"])
    assert len(events["mm_hash"].dropna().iloc[0]) >= 16


@pytest.mark.parametrize("config", ["v0.30-cache-off", "v0.30-shm", "v0.32-default"])
def test_no_self_inflicted_connection_errors_on_the_servers_that_stay_up(demo, config):
    """The 500s of oversized_image and image_file_url_not_allowed close the connection (vLLM, uvicorn): the
    request after one must not fail because of our client."""
    camp_dir, _ = demo
    d, _ = _trial(camp_dir, config)
    rows = read_table(d, "requests").to_pandas()
    assert (rows["status"] == 500).any()  # the cases that close the connection were sent
    assert (rows["outcome"] != schema.CONNECTION_ERROR).all(), rows[rows["outcome"] == schema.CONNECTION_ERROR]
    health = read_table(d, "health").to_pandas()
    assert len(health) > 10 and health["ok"].all()  # polled all through (2 a second; a loaded machine polls less)


def test_the_fixed_version_retries_its_cache_misses_to_success(demo):
    camp_dir, _ = demo
    d, _ = _trial(camp_dir, "v0.32-default")
    rows = locust_rows(read_table(d, "requests").to_pandas())
    misses = rows[(rows["status"] == 503) & (rows["kind"].isin(schema.VALID_KINDS))]
    assert len(misses) > 0 and not misses["final"].any()  # each miss was retried
    retried = rows[rows["request_group"].isin(misses["request_group"]) & rows["final"]]
    assert (retried["status"] == 200).all() and (retried["attempt"] >= 2).all()


@pytest.mark.parametrize("config", list(EXPECTED))
def test_every_request_sent_is_a_row(demo, config):
    camp_dir, _ = demo
    d, manifest = _trial(camp_dir, config)
    rows = read_table(d, "requests").to_pandas()
    assert len(rows) == manifest["requests"] > 0 and len(locust_rows(rows)) == manifest["locust_requests"]
    assert set(rows["kind"]) >= {"valid_image", "malformed_post"}


def test_a_ci_job_can_gate_on_the_verdicts(demo, tmp_path):
    camp_dir, _ = demo
    expect = [x for c, v in EXPECTED.items() for x in ("--expect", f"{c}={v}")]
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmchaos.harness.cli",
            "report",
            str(camp_dir),
            "-q",
            "--out",
            str(tmp_path / "a"),
            *expect,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    wrong = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmchaos.harness.cli",
            "report",
            str(camp_dir),
            "-q",
            "--out",
            str(tmp_path / "b"),
            "--expect",
            "v0.30-default=clean",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode == 1 and "v0.30-default: verdict fails, expected clean" in wrong.stderr


@pytest.mark.parametrize("config", ["v0.30-cache-off", "v0.30-shm", "v0.32-default"])
def test_the_real_engines_answer_a_repeated_input_the_same(demo, config):
    """The wrong-answer oracle (issue 25 item 6), on by default, checked the demo's repeated inputs on the servers
    that stay up: the real engines answer them as they answered them first (it would fail them if not)."""
    camp_dir, _ = demo
    d, _ = _trial(camp_dir, config)
    checked = read_table(d, "requests").to_pandas()["consistent"].dropna().astype(bool)
    assert len(checked) > 0 and checked.all(), checked.value_counts()
