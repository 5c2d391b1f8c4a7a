"""A short campaign on the real engine (issue 3's default mix, issue 4's runner, issue 5's report): the report's
version with default flags crashes and is classified; with the cache off it stays healthy; every request sent
is a row; the report builds from it."""

from __future__ import annotations

import json

import pytest

from mmchaos.analysis.results import load_results
from mmchaos.analysis.report import write_report
from conftest import REPORT_VERSION
from mmchaos.harness import campaign_plan, campaign_runner
from mmchaos import paths, schema
from mmchaos.tables import read_table

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def real_campaign(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    f = root / "two-configs.toml"
    f.write_text(f'''
[campaign]
name = "two-configs"
trials = 1
target = "engine"

[workload]
locustfile = "{paths.PROJECT_ROOT / 'locustfiles/embeddings.py'}"
users = 6
spawn_rate = 6
duration = 20

[[config]]
name = "default"
engine = "{REPORT_VERSION}"

[[config]]
name = "cache-off"
engine = "{REPORT_VERSION}"
flags = ["--mm-processor-cache-gb", "0"]
''')
    results = campaign_runner.CampaignRunner(campaign_plan.load(f), root / "results").run()
    return root / "results" / "two-configs", {r.config: r for r in results}


def _trial(camp_dir, config):
    d = camp_dir / config / "t000"
    return d, json.loads((d / schema.MANIFEST).read_text())


def test_default_mix_crashes_the_report_version_and_the_crash_is_classified(real_campaign):
    camp_dir, results = real_campaign
    d, manifest = _trial(camp_dir, "default")
    assert manifest["status"] == "completed"
    crashes = read_table(d, "crashes").to_pandas()
    assert len(crashes) == 1 and crashes["signature"].iloc[0] == "detokenizer_assert"
    assert crashes["t_detected"].iloc[0] - manifest["t_load_start"] < 20  # provoked within the trial
    events = read_table(d, "log_events").to_pandas()
    assert "cache_drift" in set(events["signature"])
    assert len(events["mm_hash"].dropna().iloc[0]) >= 16


def test_cache_off_ends_healthy(real_campaign):
    camp_dir, results = real_campaign
    d, manifest = _trial(camp_dir, "cache-off")
    assert manifest["status"] == "completed" and results["cache-off"].crashes == []
    health = read_table(d, "health").to_pandas()
    assert len(health) > 40 and health["ok"].all()
    events = read_table(d, "log_events").to_pandas()
    assert not {"cache_drift", "detokenizer_assert"} & set(events["signature"])
    rows = read_table(d, "requests").to_pandas()
    valid = rows[rows["kind"].isin(["valid_image", "text", "multi_image", "batch"])]
    assert (valid["outcome"] == schema.OK).mean() > 0.95


@pytest.mark.parametrize("config", ["default", "cache-off"])
def test_every_request_sent_is_a_row(real_campaign, config):
    camp_dir, _ = real_campaign
    d, manifest = _trial(camp_dir, config)
    rows = read_table(d, "requests").to_pandas()
    assert len(rows) == manifest["locust_requests"] == manifest["requests"] > 0
    assert set(rows["kind"]) >= {"valid_image", "malformed_post"}


def test_report_builds_from_the_real_campaign(real_campaign, tmp_path):
    camp_dir, _ = real_campaign
    c = load_results(camp_dir)
    assert set(c.configs) == {"default", "cache-off"}
    out = write_report(camp_dir, out_dir=tmp_path / "report")
    html = (tmp_path / "report" / "report.html").read_text()
    md = (tmp_path / "report" / "report.md").read_text()
    for text in (html, md):
        assert "default" in text and "cache-off" in text and "detokenizer_assert" in text
    assert "data:image/png;base64," in html and 'src="http' not in html
    assert out
