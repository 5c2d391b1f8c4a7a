"""Sweeps on the stand-in server: the [sweep] table checked as `campaign check` and `campaign run` both check it,
the points run in folders of their own with their knob values in the manifests and the rows, resumed on a re-run,
and the hazard read back from what they wrote. The stand-in plays vLLM 0.30's crash (--crash-after-poison: it
dies, with 0.30's log lines, when an image whose request it failed with 400 comes again)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS

from mmchaos import schema
from mmchaos.analysis import hazard as H
from mmchaos.analysis.results import load_results
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.tables import read_table

STANDIN = f"{sys.executable} {TESTS / 'standin_server.py'} --port {{port}}"
MMCHAOS = [sys.executable, "-m", "mmchaos.harness.cli"]


def sweep_campaign(
    tmp_path: Path,
    sweep: str = "malformed_post = [0, 30]",
    duration: int = 120,
    max_requests: int = 200,
    flags: str = '["--crash-after-poison"]',
    crash: str = "max_restarts = 3",
    name: str = "c.toml",
) -> Path:
    f = tmp_path / name
    f.write_text(f'''
[campaign]
name = "sweep"
trials = 1
target = "command"
command = "{STANDIN}"

[workload]
locustfile = "{TESTS.parent / "locustfiles/embeddings.py"}"
users = 3
spawn_rate = 3
duration = {duration}  # only a hung trial reaches it: each ends at its budget, or the poisoned one at its crashes
max_requests = {max_requests}

[workload.mix]
abort = 0            # one poison kind: the post-render 400
malformed_pre = 0

[workload.options]
image_preset = "small"
pool_size = 8
fresh_fraction = 0.0

[sweep]
{sweep}

[crash]
startup_timeout = 30
{crash}

[[config]]
name = "p1"
flags = {flags}
''')
    return f


@pytest.mark.integration
def test_sweep_points_run_in_their_own_folders_and_carry_their_knobs(tmp_path):
    f = sweep_campaign(tmp_path)
    plan = campaign_plan.load(f)
    assert plan.crash.policy == "restart"  # a sweep measures crashes per exposure: restart is its default
    results = campaign_runner.CampaignRunner(plan, tmp_path / "results").run()
    assert [(r.point, r.trial, r.status) for r in results] == [
        ({"malformed_post": 0}, 0, "completed"),
        ({"malformed_post": 30}, 1, "completed"),
    ]
    camp = tmp_path / "results" / "sweep"
    assert sorted(p.name for p in (camp / "p1").iterdir()) == ["malformed_post=0_t000", "malformed_post=30_t000"]
    assert json.loads((camp / schema.CAMPAIGN_MANIFEST).read_text())["sweep"] == {"malformed_post": [0, 30]}
    manifests = {}
    for point in (0, 30):
        trial = camp / "p1" / f"malformed_post={point}_t000"
        m = manifests[point] = json.loads((trial / schema.MANIFEST).read_text())
        assert m["sweep"] == {"malformed_post": point} and m["repeat"] == 0
        assert m["workload"]["mix"]["malformed_post"] == point  # what Locust was told
        kinds = set(read_table(trial, "requests").to_pandas()["kind"])
        assert ("malformed_post" in kinds) == (point > 0)  # and what it sent
    assert manifests[0]["seed"] == manifests[30]["seed"]  # points differ by their knob, not by chance

    # no poison, no crash; poison whose image comes back kills the 0.30 stand-in, and each crash is named by
    # its chain, root first
    calm, poisoned = results
    assert calm.crashes == []
    assert len(poisoned.crashes) >= 1
    assert {c.chain for c in poisoned.crashes} == {"cache_drift → detokenizer_assert"}
    crashes = read_table(camp / "p1" / "malformed_post=30_t000", "crashes").to_pandas()
    assert list(crashes["chain"]) == [c.chain for c in poisoned.crashes]

    # read back: the point is in the trials table and in every row; exposure counts only the server's up time
    c = load_results(camp)
    assert list(c.trials["sweep"].map(json.loads)) == [{"malformed_post": 0}, {"malformed_post": 30}]
    assert set(c.requests["sweep"].astype(str)) == {
        json.dumps({"malformed_post": 0}),
        json.dumps({"malformed_post": 30}),
    }
    assert not c.warnings
    exp = H.exposure(c).set_index("malformed_post")
    assert exp.loc[0, "poison_requests"] == 0 and exp.loc[0, "crashes"] == 0
    assert exp.loc[0, "uptime_s"] == pytest.approx(exp.loc[0, "duration_s"])
    hot = exp.loc[30]
    # the stand-in dies at any reuse of a poisoned image, cached before or not (vLLM only when the engine had not
    # got it: tests/test_sweep_engine.py pins that), so here every crash had a reused poison request
    assert hot["crashes"] == len(poisoned.crashes) and hot["reused_poison"] >= hot["crashes"]
    assert hot["poison_events"] <= hot["reused_poison"] <= hot["poison_requests"]
    assert hot["uptime_s"] < hot["duration_s"]  # the restarts are not exposure
    assert hot["answered"] < poisoned.requests  # nor are the requests refused meanwhile

    # a re-run resumes: both points are done
    again = campaign_runner.CampaignRunner(campaign_plan.load(f), tmp_path / "results").run()
    assert [r.skipped for r in again] == [True, True]


@pytest.mark.parametrize(
    "sweep,needle",
    [
        ("bogus = [1, 2]", "[sweep] bogus is no knob"),
        ("weight_abort = [1]", "written as the kind's name, as in [workload.mix]: abort"),
        ("abort = [1, 2]", "abort is also set in [workload.mix]: set it in one place"),
        ("multi_images = [3, 1]", "[sweep] multi_images = 1: must be at least 2"),
        ("base64_fraction = [0.5, 1.5]", "must be at most 1"),
        ("users = [2, 2]", "lists a value twice"),
        ("users = 4", "must be a list of values"),
        ("seed = [1, 2]", "set by the harness, not swept"),
        ("instruction = ['a', 'b']", "takes text, not a number"),
        ("users = [1]\npool_size = [2]\nzipf = [1.0]", "at most 2"),
    ],
)
def test_bad_sweeps_are_one_line_errors(tmp_path, sweep, needle):
    f = sweep_campaign(tmp_path, sweep=sweep)
    with pytest.raises(campaign_plan.CampaignError) as e:
        campaign_plan.load(f)
    [line] = str(e.value).splitlines()
    assert line.startswith(f"{f}:") and needle in line, line


@pytest.mark.integration
def test_check_and_run_refuse_a_bad_sweep_alike(tmp_path):
    f = sweep_campaign(tmp_path, sweep="bogus = [1, 2]")
    outs = []
    for action in ("check", "run"):
        p = subprocess.run(
            [*MMCHAOS, "campaign", action, str(f), "--results", str(tmp_path / "r")],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=TESTS.parent,
        )
        assert p.returncode == 2, p.stderr
        [line] = p.stderr.strip().splitlines()
        assert line.startswith(f"mmchaos: {f}:") and "[sweep] bogus is no knob; known: users," in line, line
        assert "Traceback" not in p.stderr
        outs.append(line)
    assert outs[0] == outs[1]  # one validation path
    assert not (tmp_path / "r").exists()  # nothing was written


def test_every_weight_zero_at_a_point_is_refused(tmp_path):
    f = sweep_campaign(tmp_path, sweep="malformed_post = [0, 1]")
    text = f.read_text().replace(
        "abort = 0",
        "abort = 0\n" + "\n".join(f"{k} = 0" for k in schema.VALID_KINDS),
    )
    f.write_text(text)
    with pytest.raises(campaign_plan.CampaignError, match=r"at malformed_post=0 every kind's weight is 0"):
        campaign_plan.load(f)


def test_folder_names_keep_points_and_repeats_apart():
    assert schema.trial_folder(3) == "t003"
    assert schema.trial_folder(1, {"malformed_post": 5, "users": 8}) == "malformed_post=5_users=8_t001"
    assert schema.trial_folder(0, {"fresh_fraction": 0.1}) == "fresh_fraction=0.1_t000"
    assert schema.trial_folder(0, {"zipf": 2.0}) == schema.trial_folder(0, {"zipf": 2})  # one point
    plan_points = [{"a": a, "b": b} for a in (1, 12) for b in (2, 12)]
    names = {schema.trial_folder(r, p) for p in plan_points for r in range(3)}
    assert len(names) == 12
