"""Campaign runner plumbing on the stand-in server: layout, crash detection and classification, restart policy,
resume, and bad campaign files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import campaign_toml
import pytest
from cli_inprocess import mmchaos
from locust_run import locust_rows

from mmchaos import schema
from mmchaos.analysis.results import load_results
from mmchaos.harness.campaign import plan as campaign_plan
from mmchaos.harness.campaign import runner as campaign_runner
from mmchaos.tables import read_table

TWO = [{"name": "healthy"}, {"name": "dies", "flags": ["--die-after", "40"]}]


def write_campaign(
    tmp_path: Path,
    *,
    policy: str = "stop",
    duration: int = 4,
    max_requests: int = 0,
    configs: list[dict] | None = None,
    **sections,
) -> Path:
    """A healthy stand-in and one that dies at its 41st request, by default. ``max_requests``: the trial's request
    budget (per Locust process), which ends it however busy the machine; the duration then only bounds a hung run."""
    return campaign_toml.write_campaign(
        tmp_path,
        configs=TWO if configs is None else configs,
        workload={"duration": duration, "max_requests": max_requests, **sections.pop("workload", {})},
        crash={"policy": policy, **sections.pop("crash", {})},
        **sections,
    )


def run(f: Path, results: Path, **kw):
    return campaign_runner.CampaignRunner(campaign_plan.load(f), results, **kw).run()


@pytest.mark.integration
def test_campaign_layout_crash_detection_and_classification(tmp_path):
    # each trial ends at its budget or at the crash (the 41st embedding request), not at a count reached in a time
    results = run(write_campaign(tmp_path, duration=120, max_requests=150), tmp_path / "results")
    by_name = {r.config: r for r in results}
    assert [r.status for r in results] == ["completed", "completed"]
    assert by_name["healthy"].crashes == []
    [crash] = by_name["dies"].crashes
    assert crash.reason == "process_exit" and crash.signature == "detokenizer_assert" and crash.exit_code == 1

    for name in ("healthy", "dies"):
        trial = tmp_path / "results" / "standin" / name / "t000"
        for f in (schema.MANIFEST, schema.SERVER_LOG, "locust.log", "locust.json"):
            assert (trial / f).is_file(), f
        manifest = json.loads((trial / schema.MANIFEST).read_text())
        assert manifest["status"] == "completed" and manifest["config"] == name
        assert manifest["git_rev"] and manifest["machine"]["cpus"] and manifest["workload"]["users"] == 3
        rows = read_table(trial, "requests").to_pandas()
        # every request is a row (Locust counts all but those cut by the end of the run)
        assert len(rows) == manifest["requests"] > 0 and len(locust_rows(rows)) == manifest["locust_requests"]
        assert (rows["config"] == name).all() and (rows["run_id"] == manifest["run_id"]).all()
        assert len(list((trial / "requests").iterdir())) == 1  # parts compacted at the end of the trial
    # the trials table reads the seed the runner wrote (it was empty for every real campaign: issue 24)
    trials = load_results(tmp_path / "results" / "standin").trials
    plan = campaign_plan.load(write_campaign(tmp_path))
    assert trials["seed"].tolist() == [plan.seed, plan.seed], trials[["config", "seed"]]

    dies = tmp_path / "results" / "standin" / "dies" / "t000"
    crashes = read_table(dies, "crashes").to_pandas()
    assert list(crashes["signature"]) == ["detokenizer_assert"]
    events = read_table(dies, "log_events").to_pandas()
    assert {"cache_drift", "detokenizer_assert"} <= set(events["signature"])
    assert events.loc[events["signature"] == "cache_drift", "mm_hash"].iloc[0] == "ab12cd34ef"
    # detected after the last answer the dead server gave (how soon: bench/detect_latency.py, docs/benchmarks.md
    # section 3, not a time a busy machine may miss)
    rows = read_table(dies, "requests").to_pandas()
    ok = rows[rows["outcome"] == schema.OK]
    last_answer = (ok["t_start"] + ok["latency_ms"] / 1000).max()
    assert last_answer <= crash.t_detected
    assert crash.t_last_healthy <= crash.t_detected


@pytest.mark.integration
def test_restart_policy_keeps_loading_and_counts_every_crash(tmp_path):
    # the server dies when told (--die-on-file): once the load has 30 rows, and again once the restarted server
    # has taken 30 more; the second crash ends the trial (max_restarts = 1). Two crashes by events, however busy
    # or fast the machine (the budget and the duration only bound a hung run)
    die = tmp_path / "die"
    f = write_campaign(
        tmp_path,
        policy="restart",
        duration=120,
        max_requests=5000,
        crash={"max_restarts": 1},
        configs=[{"name": "dies", "flags": ["--die-on-file", str(die)]}],
    )
    since: dict[int, int] = {}  # crashes so far -> rows when the runner first said "load" with that many
    told = []

    def tell_it_to_die(state):
        # after a crash the runner says "load" again once the restarted server is seen up
        if state.get("phase") != "load":
            return
        crashes = state["crashes"]
        since.setdefault(crashes, state["requests"])
        if crashes == len(told) < 2 and state["requests"] >= since[crashes] + 30:
            told.append(state["requests"])
            die.touch()

    [result] = run(f, tmp_path / "results", progress=tell_it_to_die)
    assert len(told) == 2, told
    assert result.status == "completed"
    assert len(result.crashes) == 2
    assert [c.restart for c in result.crashes] == list(range(len(result.crashes)))
    trial = tmp_path / "results" / "standin" / "dies" / "t000"
    manifest = json.loads((trial / schema.MANIFEST).read_text())
    assert manifest["crashes"] == len(result.crashes)
    assert manifest["requests"] - manifest["cut"] == manifest["locust_requests"]
    # the server was answering again after each restart: successes after the first crash
    rows = read_table(trial, "requests").to_pandas()
    assert (rows.loc[rows["t_start"] > result.crashes[0].t_detected, "outcome"] == schema.OK).any()


@pytest.mark.integration
def test_rerun_resumes_and_force_reruns(tmp_path):
    f = write_campaign(tmp_path, duration=2, configs=[{"name": "healthy"}])
    run(f, tmp_path / "results")
    manifest = tmp_path / "results" / "standin" / "healthy" / "t000" / schema.MANIFEST
    before = json.loads(manifest.read_text())
    [again] = run(f, tmp_path / "results")
    assert again.skipped and json.loads(manifest.read_text()) == before
    [forced] = run(f, tmp_path / "results", force=True)
    assert not forced.skipped and json.loads(manifest.read_text())["run_id"] != before["run_id"]


@pytest.mark.integration
def test_unfinished_trial_is_run_again(tmp_path):
    f = write_campaign(tmp_path, duration=2, configs=[{"name": "healthy"}])
    trial = tmp_path / "results" / "standin" / "healthy" / "t000"
    trial.mkdir(parents=True)
    (trial / schema.MANIFEST).write_text(json.dumps({"status": "interrupted"}))
    [r] = run(f, tmp_path / "results")
    assert not r.skipped and r.status == "completed"


@pytest.mark.parametrize(
    "body,needle",
    [
        (
            '[campaign]\nname = "x"\ntrails = 2\n[[config]]\nname = "a"\n',
            ":3: unknown key 'trails' in [campaign]; did you mean 'trials'?",
        ),
        ('[campaign]\nname = "x"\ntrials = "two"\n[[config]]\nname = "a"\n', ":3: 'trials' must be int, not str"),
        (
            '[campaign]\nname = "x"\n[workload]\nusers = 2\nshape = "steady"\n[crash]\npolicy = "retry"\n'
            '[[config]]\nname = "a"\nengine = "0.30.0"\n',
            ":7: policy 'retry' unknown; did you mean 'restart'?",
        ),
        (
            '[campaign]\nname = "x"\n[[config]]\nname = "a"\nengine = "0.30.0"\n[[config]]\nname = "b"\n'
            'engin = "0.32.0"\n',
            ":8: unknown key 'engin' in [config]; did you mean 'engine'?",
        ),
        ('[campaign]\nname = "x"\n', "no [[config]] tables"),
        ('[campain]\nname = "x"\n', "unknown section [campain]; did you mean 'campaign'?"),
        ('[campaign\nname = "x"\n', "not valid TOML"),
        ('[campaign]\nname = "x"\n[[config]]\nname = "a"\nengine = "banana"\n', "'banana' is not a vLLM version"),
    ],
)
def test_bad_campaign_files_name_file_line_and_hint(tmp_path, body, needle):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    r = mmchaos("campaign", "check", str(f))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and needle in lines[0], r.stderr


def test_unknown_mix_kind_is_rejected_before_anything_runs(tmp_path):
    f = write_campaign(tmp_path, configs=[{"name": "a"}], mix={"valid_imgae": 3})
    r = mmchaos("campaign", "run", str(f), "--results", str(tmp_path / "results"))  # refused before anything runs
    assert r.returncode == 2 and "unknown kind 'valid_imgae'" in r.stderr
    assert not (tmp_path / "results" / "standin").exists()


@pytest.mark.integration
def test_progress_in_a_ci_log_is_one_line_per_phase_and_per_trial(tmp_path):
    """No terminal: plain lines with elapsed, done/total and ETA, the counts right, the summary on its own line."""
    f = write_campaign(tmp_path, duration=120, max_requests=150)  # "dies" dies at its 41st request
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmchaos.harness.cli",
            "campaign",
            "run",
            str(f),
            "--results",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    phases = [ln for ln in lines if ln.startswith("[") and " done, ETA " in ln]
    assert any(ln.endswith("healthy/t0: starting server") and "0/2 done" in ln for ln in phases), phases
    assert any(ln.endswith("healthy/t0: load") for ln in phases)
    finished = [ln for ln in phases if ": completed, " in ln]
    assert len(finished) == 2 and "1/2 done" in finished[0] and "2/2 done, ETA 0:00]" in finished[1], finished
    assert "dies/t0: completed" in finished[1] and "1 crash(es) (cache_drift → detokenizer_assert)" in finished[1]
    assert any(ln.startswith("trials of campaign standin") for ln in lines)  # the summary title starts a line


@pytest.mark.integration
def test_the_report_verdicts_and_expect_gate_on_the_standin(tmp_path):
    # one user: a retry is never overtaken by a second poisoning of its image (with more users it can be, and three
    # misses in a row are a fair "fails")
    f = write_campaign(
        tmp_path,
        duration=120,
        max_requests=150,
        configs=[*TWO, {"name": "misses", "flags": ["--miss-after-poison"]}],
        workload={"users": 1},
        options={"pool_size": 2, "fresh_fraction": 0.0, "malformed_cases": "dimensions_unsupported"},
        mix={"malformed_pre": 0},
    )
    results = run(f, tmp_path / "results")
    assert [r.status for r in results] == ["completed"] * 3
    expect = ["--expect", "healthy=clean", "--expect", "dies=fails", "--expect", "misses=retryable"]
    r = subprocess.run(
        [sys.executable, "-m", "mmchaos.harness.cli", "report", str(tmp_path / "results" / "standin"), "-q", *expect],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    md_file = tmp_path / "results" / "standin" / "report" / "report.md"
    written = md_file.stat().st_mtime_ns if md_file.exists() else None
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmchaos.harness.cli",
            "report",
            str(tmp_path / "results" / "standin"),
            "-q",
            "--expect",
            "misses=clean",
            "--expect",
            "nope=clean",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--expect nope: no such configuration" in r.stderr
    assert (md_file.stat().st_mtime_ns if md_file.exists() else None) == written  # refused before any work
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmchaos.harness.cli",
            "report",
            str(tmp_path / "results" / "standin"),
            "-q",
            "--expect",
            "misses=clean",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "misses: verdict retryable, expected clean" in r.stderr
    md = (tmp_path / "results" / "standin" / "report" / "report.md").read_text()
    assert "| clean |" in md and "| fails |" in md and "| survives with retryable errors |" in md
