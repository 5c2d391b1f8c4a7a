"""analysis/: statistics checked against answers worked out by hand, loading of incomplete trials, the report
end to end (self-contained, escaped), and the command line's bad-input behaviour."""

from __future__ import annotations

import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from cli_inprocess import mmchaos
from synthetic import SyntheticConfig, make_campaign

from mmchaos import cause_rule
from mmchaos import manifest as M
from mmchaos import schema as S
from mmchaos.analysis import intervals as I
from mmchaos.analysis import plots, report, stats
from mmchaos.analysis.attribution import SAME_IMAGE, WINDOW, attribute
from mmchaos.analysis.results import LoadError, load_results
from mmchaos.analysis.survival import first_crash_durations, kaplan_meier, median_survival
from mmchaos.analysis.verdict import verdicts
from mmchaos.tables import table_dir

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000.0


# --- building small results by hand --------------------------------------------------------------------


def write_trial(
    camp: Path,
    config: str,
    trial: int,
    *,
    requests=(),
    health=(),
    metrics=(),
    log_events=(),
    crashes=(),
    manifest: dict | None = None,
    server_log: str | None = "INFO up\n",
) -> Path:
    folder = camp / config / S.trial_folder(trial)
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (
        ("requests", requests),
        ("health", health),
        ("metrics", metrics),
        ("log_events", log_events),
        ("crashes", crashes),
    ):
        if rows:
            d = table_dir(folder, name)
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(S.table_from_rows(list(rows), S.TABLES[name]), d / "part-test-000000.parquet")
    if manifest is not None:
        m = {
            "campaign": camp.name,
            "config": config,
            "trial": trial,
            "engine": "0.30.0",
            "flags": [],
            "env": {},
            "target": "engine",
            "workload": {"users": 1},
            "t_start": T0,
            "t_end": T0 + 1800,
            "status": "completed",
            "git_rev": "abc",
            "machine": "test",
        }
        m.update(manifest)
        (folder / S.MANIFEST).write_text(json.dumps(M.TrialManifest.model_validate(m).dump()))
    if server_log is not None:
        (folder / S.SERVER_LOG).write_text(server_log)
    return folder


def req(
    t,
    kind="valid_image",
    outcome=S.OK,
    status=200,
    hashes="h1",
    case=None,
    expected=None,
    latency=100.0,
    request_id=None,
    endpoint=None,
):
    n_images = 0 if hashes is None else len(hashes.split(","))
    return {
        "endpoint": endpoint,
        "t_start": T0 + t,
        "kind": kind,
        "outcome": outcome,
        "status": status,
        "image_hashes": hashes,
        "n_images": n_images,
        "case": case,
        "expected_status": expected,
        "latency_ms": latency,
        "request_id": request_id,
    }


def health(ts, ok=True):
    return [{"t": T0 + t, "ok": ok, "status": 200 if ok else None} for t in ts]


# --- intervals -----------------------------------------------------------------------------------------


def test_poisson_exact_interval():
    # 3 crashes in 10,000 requests, per 1,000: 0.3.  Garwood: lower = chi2(0.025; 2k=6)/2 = 1.2373/2 = 0.61867,
    # upper = chi2(0.975; 2k+2=8)/2 = 17.5345/2 = 8.76727 events -> per 1,000 of 10,000 requests: x 0.1.
    est, lo, hi = I.poisson_rate_ci(3, 10_000, 1000)
    assert est == pytest.approx(0.3)
    assert lo == pytest.approx(0.061867, abs=1e-5)
    assert hi == pytest.approx(0.876727, abs=1e-5)
    # 0 events: lower 0, upper chi2(0.975; 2)/2 = -ln(0.025) = 3.68888
    est, lo, hi = I.poisson_rate_ci(0, 1.0)
    assert (est, lo) == (0, 0)
    assert hi == pytest.approx(3.68888, abs=1e-5)


def test_spans_are_printed_in_the_unit_of_their_magnitude():
    from mmchaos.analysis.formatting import duration

    assert [duration(x) for x in (2.36, 25, 119, 120, 2.4 * 60, 7199, 7200, 5 * 3600, None)] == [
        "2.36 s",
        "25.0 s",
        "119 s",
        "2.00 min",
        "2.40 min",
        "120 min",
        "2.00 h",
        "5.00 h",
        "—",
    ]


def test_wilson_interval():
    # 3 of 10, z = 1.959964: centre = (0.3 + z²/20) / (1 + z²/10) = 0.49207/1.38415 = 0.35551,
    # half = z * sqrt(0.3*0.7/10 + z²/400) / 1.38415 = 1.959964 * 0.174940 / 1.38415 = 0.24772
    p, lo, hi = I.wilson_ci(3, 10)
    assert p == 0.3
    assert lo == pytest.approx(0.35551 - 0.24772, abs=1e-4)  # 0.1078
    assert hi == pytest.approx(0.35551 + 0.24772, abs=1e-4)  # 0.6032
    assert all(np.isnan(I.wilson_ci(0, 0)))


def test_percentiles_tiny_set():
    # linear interpolation on [10, 20, 30, 40, 100]: h = 4q; p50: h=2 -> 30; p90: h=3.6 -> 40 + 0.6*60 = 76;
    # p95: h=3.8 -> 88; p99: h=3.96 -> 97.6
    est, lo, hi, _ = I.bootstrap_quantiles([40, 10, 100, 30, 20], stats.QUANTILES)
    assert est == pytest.approx([30, 76, 88, 97.6])
    assert np.all(lo <= est) and np.all(est <= hi)
    assert np.all(lo >= 10) and np.all(hi <= 100)


def test_bootstrap_shortcut_matches_resampling():
    # the Beta order-statistic draw must give the same interval as resampling the data
    x = np.random.default_rng(1).lognormal(4.0, 0.6, 300)
    qs = [0.5, 0.95]
    _, lo, hi, _ = I.bootstrap_quantiles(x, qs, n_boot=20_000)
    res = np.quantile(x[np.random.default_rng(2).integers(0, len(x), (20_000, len(x)))], qs, axis=1)
    lo_ref, hi_ref = np.quantile(res, [0.025, 0.975], axis=1)
    assert lo == pytest.approx(lo_ref, rel=0.03)
    assert hi == pytest.approx(hi_ref, rel=0.03)


# --- survival ------------------------------------------------------------------------------------------


def test_kaplan_meier_with_censoring():
    # 5 trials: crash at 100, ended without crash at 200, crash at 300, ended at 300, crash at 500.
    # t=100: 5 at risk, 1 crash -> S = 4/5 = 0.8;  (200 censored leaves 3 at risk)
    # t=300: 3 at risk, 1 crash -> S = 0.8 * 2/3 = 0.5333 (the censored one at 300 counts as at risk)
    # t=500: 1 at risk, 1 crash -> S = 0.  Median: first t with S <= 0.5 -> 500.
    km = kaplan_meier([100, 200, 300, 300, 500], [True, False, True, False, True])
    s = km.set_index("t")["survival"]
    assert s[0] == 1.0 and s[100] == pytest.approx(0.8) and s[200] == pytest.approx(0.8)
    assert s[300] == pytest.approx(0.8 * 2 / 3) and s[500] == 0.0
    assert km.set_index("t")["at_risk"][300] == 3
    assert median_survival(km) == 500
    assert (km["lo"] <= km["survival"] + 1e-12).all() and (km["hi"] >= km["survival"] - 1e-12).all()
    # nobody crashed: flat at 1, no median
    assert np.isnan(median_survival(kaplan_meier([10, 20], [False, False])))


# --- one small hand-built campaign ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> Path:
    """Two configurations, two 30-minute trials each (1 hour of load per config).

    buggy/t000: malformed_post with image h1 at 100 s, valid h1 at 104 s (drift line at 104.1 s naming that
    request by its X-Request-Id, and vLLM's own mm_hash of the image),
    unrelated valid h2 at 103 s, text at 103.5 s; the server dies: crash detected at 106 s, last healthy
    104.5 s; a valid request at 105 s is refused; one failed health poll.  Also a drift line at 300 s with an
    mm_hash and no request of ours named (-> window fallback).  buggy/t001: no incident.
    fixed: the same poison and valid requests, all fine, no drift, no crash.
    """
    camp = tmp_path_factory.mktemp("results") / "handmade"
    seq = [
        req(10, "text", hashes=None),
        req(100, "malformed_post", S.HTTP_ERROR, 400, "h1", "dimensions", 400),
        req(103, "valid_image", hashes="h2"),
        req(103.5, "text", hashes=None),
        req(104, "valid_image", hashes="h1", request_id="mmc-r-0-0-5"),
    ]
    write_trial(
        camp,
        "buggy",
        0,
        manifest={},
        health=health([50, 100]) + health([105], ok=False),
        requests=seq
        + [req(105, "valid_image", S.CONNECTION_ERROR, None, "h1")]
        + [req(200 + i, "text", hashes=None) for i in range(494)],
        log_events=[
            {
                "t": T0 + 104.1,
                "signature": "cache_drift",
                "fatal": False,
                "mm_hash": "9a9a" * 16,
                "request_id": "mmc-r-0-0-5",
                "line": "drift embd-mmc-r-0-0-5",
            },
            {"t": T0 + 300, "signature": "cache_drift", "fatal": False, "mm_hash": "ffff", "line": "drift ?"},
        ],
        crashes=[
            {
                "t_detected": T0 + 106,
                "t_last_healthy": T0 + 104.5,
                "reason": "process_exit",
                "signature": "detokenizer_assert",
                "exit_code": 1,
                "restart": 0,
            }
        ],
    )
    write_trial(
        camp,
        "buggy",
        1,
        manifest={"t_start": T0 + 2000, "t_end": T0 + 3800},
        requests=[req(2000 + i, "text", hashes=None) for i in range(500)],
        health=health([2010]),
    )
    for trial in (0, 1):
        start = T0 + 5000 * (trial + 1)
        write_trial(
            camp,
            "fixed",
            trial,
            manifest={"t_start": start, "t_end": start + 1800, "flags": ["--mm-processor-cache-gb", "0"]},
            requests=[dict(r, t_start=r["t_start"] + 5000 * (trial + 1)) for r in seq]
            + [req(5000 * (trial + 1) + 200 + i, "text", hashes=None, latency=10.0 * (i % 5 + 1)) for i in range(495)],
            health=health([5000 * (trial + 1) + 50, 5000 * (trial + 1) + 150]),
        )
    return camp


def test_load_hand_campaign(hand):
    c = load_results(hand)
    assert c.configs == ["buggy", "fixed"]
    assert len(c.trials) == 4 and (c.trials["n_requests"] == 500).all()
    assert len(c.requests) == 2000
    for name in ("requests", "health", "metrics", "log_events", "crashes"):
        assert {"campaign", "config", "trial", "t_rel"} <= set(c.table(name).columns)
    assert c.crashes["t_rel"].iloc[0] == pytest.approx(106)


def test_crash_rates_and_trials_crashed(hand):
    c = load_results(hand)
    cs = stats.crash_stats(c).set_index("config")
    b = cs.loc["buggy"]
    # 1 crash in 1 hour and in 1,000 requests: rate 1, exact interval [chi2(.025;2)/2, chi2(.975;4)/2]
    # = [0.025318, 5.571643]
    assert (b["crashes"], b["hours"], b["requests"]) == (1, pytest.approx(1.0), 1000)
    assert (b["per_hour"], b["per_hour_lo"], b["per_hour_hi"]) == pytest.approx((1.0, 0.025318, 5.571643), abs=1e-5)
    assert (b["per_1k_requests"], b["per_1k_requests_hi"]) == pytest.approx((1.0, 5.571643), abs=1e-5)
    # 1 of 2 trials crashed: Wilson (z=1.96): centre 0.5, half = 1.96*sqrt(.125+.9604/16)/(1+1.9208) = 0.4055
    assert (b["share_crashed"], b["share_crashed_lo"], b["share_crashed_hi"]) == pytest.approx(
        (0.5, 0.0945, 0.9055), abs=1e-3
    )
    assert cs.loc["fixed", "crashes"] == 0 and cs.loc["fixed", "per_hour_hi"] == pytest.approx(3.68888, abs=1e-4)


def test_time_and_requests_to_first_crash(hand):
    c = load_results(hand)
    d = first_crash_durations(c.trials, c.requests, c.crashes).set_index(["config", "trial"])
    # crash detected 106 s in, after 6 requests had been sent (t = 10, 100, 103, 103.5, 104, 105)
    assert d.loc[("buggy", 0), "crashed"] and d.loc[("buggy", 0), "time_s"] == pytest.approx(106)
    assert d.loc[("buggy", 0), "requests"] == 6
    # the others are censored at their end: 1800 s and all 500 requests
    assert not d.loc[("buggy", 1), "crashed"] and d.loc[("buggy", 1), "time_s"] == pytest.approx(1800)
    assert d.loc[("fixed", 1), "requests"] == 500


def test_attribution_picks_the_poison(hand):
    c = load_results(hand)
    events, summary = attribute(c, window_s=10)
    ev = events.set_index(["event", "signature", "t_rel"]).sort_index()
    drift = events[(events["event"] == "drift") & (events["mm_hash"] == "h1")].iloc[0]
    # same image h1 in [94.1, 104.1]: the malformed_post at 100 and the valid request at 104 — not h2, not text
    assert drift["match"] == SAME_IMAGE
    assert drift["requests"] == 2
    assert set(drift["sent"].split(", ")) == {"malformed_post/dimensions ×1", "valid_image ×1"}
    assert drift["last_sent"] == "valid_image"
    # the unknown mm_hash falls back to all image requests in [290, 300]: there are none
    unknown = events[(events["event"] == "drift") & events["mm_hash"].isna()].iloc[0]
    assert unknown["match"] == WINDOW and unknown["requests"] == 0
    # the crash: images in [94.5, 106]: malformed h1 @100, h2 @103, h1 @104, refused h1 @105 (text has none)
    crash = events[events["event"] == "crash"].iloc[0]
    assert crash["match"] == WINDOW and crash["requests"] == 4
    assert "malformed_post/dimensions ×1" in crash["sent"]
    s = summary[(summary["config"] == "buggy") & (summary["event"] == "drift")].set_index(["kind", "case"])
    assert s.loc[("malformed_post", "dimensions"), "events_with"] == 1
    assert ("text", "—") not in s.index
    del ev


def test_verdicts(hand):
    c = load_results(hand)
    v = verdicts(c).set_index("config")
    assert v.loc["fixed", "verdict"] == "clean" and v.loc["fixed", "title"] == "clean"
    assert (v.loc["fixed", ["fails_alone", "stays_up", "normal_ok", "no_drift", "first_try"]] == "ok").all()
    b = v.loc["buggy"]
    assert b["verdict"] == "fails" and b["title"] == "fails"
    assert b["fails_alone"] == "ok"  # the malformed request did get its 400
    assert b["stays_up"] == "failed" and b["no_drift"] == "failed"
    # the valid request refused while the server was down (105 s) is the server's failure, with no retry (old rows)
    assert b["normal_ok"] == "failed" and b["first_try"] == "failed"
    assert any("1 crash(es), 1 of 4 /health polls failed" in e for e in b["evidence"])
    assert any(
        "998 of 999 valid requests succeeded; failures after the last retry: connection_error ×1" in e
        for e in b["evidence"]
    )
    assert any("2 drift line(s) logged" in e and "cache_drift ×2" in e for e in b["evidence"])


def test_latency_percentiles_per_kind(hand):
    c = load_results(hand)
    lat = stats.latency_table(c).set_index(["config", "kind"])
    # fixed text latencies: 10,20,30,40,50 ms, 198 times each, + 4 at 100 ms (t=10 and 103.5 in both trials);
    # 994 values, median at sorted position 496.5: inside the block of 30s (positions 396..593) -> 30
    assert lat.loc[("fixed", "text"), "p50"] == 30
    assert lat.loc[("fixed", "text"), "n"] == 994
    cost = stats.workaround_cost(c, "buggy").set_index(["config", "kind"])
    assert cost.loc[("buggy", "text"), "p50_ratio"] == 1.0
    assert cost.loc[("fixed", "text"), "p50_ratio"] == pytest.approx(30 / 100)


# --- figures: the unit of a time axis, the timeline's second axis --------------------------------------


@pytest.fixture
def drawn(monkeypatch):
    """The figures a plotting function makes, kept open to be read instead of turned into PNG bytes."""
    figs: list = []
    monkeypatch.setattr(plots, "to_png", lambda fig, tight=True: figs.append(fig) or b"")
    yield figs
    for fig in figs:
        plots.plt.close(fig)


def test_a_trial_that_crashed_in_seconds_is_drawn_in_seconds(tmp_path, drawn):
    """A trial whose server died 5 s into its load: its timeline, the throughput and the survival figures are
    in seconds over those 5 s (not squashed near 0 of a minutes axis); the timeline's second axis says what it
    counts, in the line's colour, as large as the left axis' label."""
    camp = tmp_path / "short"
    write_trial(
        camp,
        "v",
        0,
        manifest={"t_start": T0, "t_end": T0 + 5},
        requests=[req(0.5 * i) for i in range(9)] + [req(4.6, "valid_image", S.CONNECTION_ERROR, None)],
        health=health([1, 3]) + health([4.8], ok=False),
        metrics=[
            {"t": T0 + t, "name": "vllm:num_requests_running", "labels": "{}", "value": float(n)}
            for t, n in ((1, 2), (2, 3), (3, 4), (4, 1))
        ],
        crashes=[
            {
                "t_detected": T0 + 5,
                "t_last_healthy": T0 + 3,
                "reason": "health_failed",
                "signature": "detokenizer_assert",
                "exit_code": None,
                "restart": 0,
            }
        ],
    )
    c = load_results(camp)

    _, hidden = plots.timelines(c, "v")
    (fig,) = drawn
    ax, ax2 = fig.axes  # the trial's panel and its second (right) axis
    assert hidden == []
    assert ax.get_xlabel() == "seconds since trial start"
    lo, hi = ax.get_xlim()
    assert lo == 0 and 5 <= hi <= 5.5  # the whole trial, a crash at its very end in sight
    assert [list(x.get_xdata()) for x in ax.get_lines() if x.get_linestyle() == "--"] == [[5, 5]]  # the crash
    assert ax2.get_ylabel() == "requests running\n(vLLM /metrics)"
    assert ax2.yaxis.label.get_fontsize() >= ax.yaxis.label.get_fontsize() >= 8
    assert ax2.yaxis.label.get_color() == ax2.get_lines()[0].get_color()
    assert list(ax2.get_lines()[0].get_xdata()) == [1, 2, 3, 4]
    assert plots.RUNNING_LABEL in [t.get_text() for t in fig.legends[0].get_texts()]

    plots.throughput_over_time(stats.throughput_over_time(c), c.configs)
    durations = first_crash_durations(c.trials, c.requests, c.crashes)
    km = {"v": {w: kaplan_meier(durations[w], durations["crashed"]) for w in ("time_s", "requests")}}
    plots.survival(km, durations, c.configs)
    throughput, (time_panel, _) = drawn[1].axes[0], drawn[2].axes
    assert throughput.get_xlabel() == "seconds since trial start"
    assert 4 <= throughput.get_xlim()[1] < 6
    assert time_panel.get_xlabel() == "seconds of load"
    assert 5 <= time_panel.get_xlim()[1] < 6

    # beside a configuration of 30-minute trials: each timeline follows its own trials (in seconds, 1 s bins, not
    # one 30 s bin for the whole crashed trial); the figures of the whole campaign, in minutes
    write_trial(camp, "long", 0, manifest={"t_start": T0 + 100, "t_end": T0 + 1900}, requests=[req(110)])
    c = load_results(camp)
    drawn.clear()
    plots.timelines(c, "v")
    plots.timelines(c, "long")
    plots.throughput_over_time(stats.throughput_over_time(c), c.configs)
    (short, _), (long,), (throughput,) = (f.axes for f in drawn)
    assert short.get_xlabel() == "seconds since trial start" and short.get_title() == "v: timeline per trial (1 s bins)"
    assert max(short.patches[0].get_data().edges) == 5  # the ok / s stairs: five 1 s bins
    assert long.get_xlabel() == throughput.get_xlabel() == "minutes since trial start"
    assert 30 <= long.get_xlim()[1] <= 31


def test_a_trial_of_half_an_hour_is_drawn_in_minutes(hand, drawn):
    c = load_results(hand)
    plots.timelines(c, "buggy")
    axes = drawn[0].axes  # one panel per trial, sharing the x axis; the bottom one is labelled
    assert [a.get_xlabel() for a in axes] == ["", "minutes since trial start"]
    lo, hi = axes[0].get_xlim()
    assert lo == 0 and 30 <= hi <= 31  # two 1800 s trials, drawn whole (their requests stop at 12 minutes)
    assert plots.time_unit(180) == (1.0, "seconds") and plots.time_unit(181) == (60.0, "minutes")


# --- loading incomplete trials -------------------------------------------------------------------------


def test_load_trial_with_missing_files(tmp_path):
    camp = tmp_path / "partial"
    # an interrupted trial: requests only, no manifest, no health, no server log
    write_trial(camp, "a", 0, requests=[req(1), req(5, "text", hashes=None)], server_log=None)
    # a trial that wrote its manifest and nothing else yet
    write_trial(camp, "a", 1, manifest={"status": "interrupted", "t_end": None})
    # a truncated part file must not stop the rest
    bad = table_dir(camp / "a" / "t000", "requests") / "part-test-000001.parquet"
    bad.write_bytes(b"PAR1 not really")
    c = load_results(camp)
    t = c.trials.set_index("trial")
    assert t.loc[0, "status"] == "unknown" and not t.loc[0, "has_manifest"]
    assert "manifest.json" in t.loc[0, "missing"] and "health" in t.loc[0, "missing"]
    assert t.loc[0, "t_start"] == pytest.approx(T0 + 1) and t.loc[0, "duration_s"] == pytest.approx(4.1)
    assert t.loc[1, "status"] == "interrupted" and t.loc[1, "n_requests"] == 0
    assert len(c.requests) == 2 and len(c.health) == 0 and list(c.health.columns)[:3] == ["campaign", "config", "trial"]
    assert any("part-test-000001" in w for w in c.warnings)
    # the statistics still run on it
    assert stats.crash_stats(c)["crashes"].sum() == 0
    v = verdicts(c).loc[0]
    assert v["verdict"] == "clean" and v["stays_up"] == "not exercised"  # nothing failed; /health was not watched


def test_a_replay_that_sent_its_whole_log_is_timed_by_the_log(tmp_path):
    """Issue 23: a replay's load time is its log's (first request to last answer), not Locust's start to its exit;
    a replay stopped early keeps Locust's window."""
    camp = tmp_path / "replays"
    account = {"requests": 2, "sent": 2, "not_sent": 0, "t_first": T0 + 3, "t_done": T0 + 9.5}
    locust = {"t_load_start": T0 + 1, "t_load_end": T0 + 40}  # Locust's start-up, then its -t or its shutdown
    write_trial(camp, "a", 0, requests=[req(4)], manifest={**locust, "replay": {**account, "complete": True}})
    write_trial(camp, "a", 1, requests=[req(4)], manifest={**locust, "replay": {**account, "complete": False}})
    t = load_results(camp).trials.set_index("trial")
    assert t.loc[0, "t_start"] == T0 + 3 and t.loc[0, "duration_s"] == pytest.approx(6.5)
    assert t.loc[1, "t_start"] == T0 + 1 and t.loc[1, "duration_s"] == pytest.approx(39)


def test_a_manifest_of_another_version_is_read_with_what_it_holds(tmp_path):
    """Older manifests (fewer keys) read with defaults; keys this version does not know are passed over; a value
    it cannot read is left out with a note, the rest of the trial kept. What we write has to be ours, key by key."""
    camp = tmp_path / "old"
    folder = write_trial(camp, "a", 0, requests=[req(4)], manifest={})
    (folder / S.MANIFEST).write_text(
        json.dumps({"config": "a", "trial": "0", "status": "completed", "t_start": T0, "added_later": {"x": 1}})
    )
    folder = write_trial(camp, "a", 1, requests=[req(4)], manifest={})
    (folder / S.MANIFEST).write_text(json.dumps({"trial": 1, "status": "completed", "seed": "many", "t_start": T0}))
    c = load_results(camp)
    t = c.trials.set_index("trial")
    assert list(t["status"]) == ["completed", "completed"] and t["has_manifest"].all()
    assert pd.isna(t.loc[0, "users"]) and t.loc[0, "flags"] == ""  # not given
    assert pd.isna(t.loc[1, "seed"])
    [note] = [w for w in c.warnings if "seed" in w]
    assert note.startswith("a/t001: 'seed' should be a valid integer") and "read as not given" in note
    with pytest.raises(ValueError, match="added_later"):
        M.TrialManifest(status="completed", added_later=1)
    with pytest.raises(ValueError, match="status"):
        M.TrialManifest().status = "done"
    hunt = M.TrialManifest(target="engine", engine="0.30.0", flags=[], env={})  # a writer of five keys writes five
    assert set(hunt.dump()) == {"target", "engine", "flags", "env"}


def test_load_errors(tmp_path):
    with pytest.raises(LoadError, match="not a folder"):
        load_results(tmp_path / "nope")
    with pytest.raises(LoadError, match="no trials"):
        load_results(tmp_path)


# --- the report end to end -----------------------------------------------------------------------------


EVIL = '<script>alert("x")</script> & <img src=http://evil.example/x.png>'


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    cfgs = (
        SyntheticConfig("default", crash_per_hour=40.0),
        SyntheticConfig("no-mm-cache", ["--mm-processor-cache-gb", "0"], latency_factor=1.3),
    )
    a = make_campaign(root, "before", cfgs, trials=2, requests_per_trial=400, duration_s=300, error_text=EVIL)
    b = make_campaign(root, "after", cfgs[:1], trials=2, requests_per_trial=400, duration_s=300, seed=1)
    res = report.write_report(a, compare_with=b)
    return a, res


def test_report_end_to_end(built):
    camp, res = built
    assert res.out_dir == camp / "report"
    names = {p.name for p in res.files}
    assert {"report.md", "report.html", "survival.png", "latency.png"} <= names
    assert not list(res.out_dir.glob(".*tmp*"))
    md = res.markdown.read_text()
    for section in (
        "## Summary",
        "## Verdict per configuration",
        "## Crashes",
        "## Cost of the workaround",
        "## What caused each incident, and what was sent before it",
        "## Side by side: the two campaigns",
    ):
        assert section in md
    assert "before/default" in md and "after/default" in md
    assert "(survival.png)" in md


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.links = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.links += [v or "" for k, v in attrs if k in ("src", "href")]


def test_html_is_self_contained_and_escaped(built):
    _, res = built
    html = res.html.read_text()
    parsed = _Tags()
    parsed.feed(html)
    # every link is in-page or inline data; the evil <img src=http...> is text, not a tag
    assert parsed.links and all(v.startswith(("#", "data:image/png;base64,")) for v in parsed.links)
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "data:image/png;base64," in html
    assert "<script" not in res.markdown.read_text()


def _report_cli(*args: str) -> subprocess.CompletedProcess:
    return mmchaos("report", *args)


def test_cli_bad_input(tmp_path):
    p = _report_cli(str(tmp_path / "missing"))
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "not a folder" in p.stderr
    p = _report_cli(str(tmp_path), "--out", str(tmp_path / "out"))
    assert p.returncode == 2 and "no trials" in p.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_cli_bad_baseline(built, tmp_path):
    camp, _ = built
    p = _report_cli(str(camp), "--baseline", "nope", "--out", str(tmp_path / "o"))
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "baseline 'nope'" in p.stderr
    assert not (tmp_path / "o").exists()


def test_not_exercised_checks_are_no_failures(tmp_path):
    """An abort-only run on a server that answers everything: no malformed request was sent, so "the bad request
    fails alone" was not exercised, and that is no failure of the server."""
    camp = tmp_path / "aborts"
    write_trial(
        camp,
        "a",
        0,
        manifest={},
        health=health([1, 2]),
        requests=[req(1 + i / 10, "abort", S.ABORTED, None, "h1") for i in range(5)]
        + [req(2 + i / 10, "valid_image", hashes="h1") for i in range(5)],
    )
    v = verdicts(load_results(camp)).set_index("config").loc["a"]
    assert v["verdict"] == "clean" and v["fails_alone"] == "not exercised"
    # rows written without the wrong-answer oracle: nothing compared, not exercised either
    assert v["not_exercised"] == ["the bad request fails alone", "repeated inputs get the same answer"]
    assert any("the bad request fails alone: not exercised — no malformed request was sent" in e for e in v["evidence"])


def test_unanswered_or_wrong_answers_to_bad_requests_are_the_servers_failures(tmp_path):
    camp = tmp_path / "bad"
    bad = [req(1 + i, "malformed_post", S.HTTP_ERROR, 400, "h1", "dimensions", 400) for i in range(3)]
    write_trial(
        camp,
        "a",
        0,
        manifest={},
        health=health([1, 2]),
        requests=bad
        + [
            req(5, "malformed_post", S.TIMEOUT, None, "h2", "dimensions", 400),
            req(6, "malformed_post", S.HTTP_ERROR, 500, "h3", "dimensions", 400),
        ],
    )
    v = verdicts(load_results(camp)).set_index("config").loc["a"]
    assert v["verdict"] == "fails" and v["fails_alone"] == "failed"
    assert any(
        "3 of 5 malformed requests got their expected status; the others got" in e
        and "500 ×1" in e
        and "timeout ×1" in e
        for e in v["evidence"]
    )


def test_default_baseline_is_the_shipped_server_that_kept_serving(hand):
    c = load_results(hand)
    assert stats.default_baseline(c) == "buggy"  # the only one without extra flags, crashed or not
    # were "fixed" also run without extra flags, it would be the baseline: it did not crash
    c.trials.loc[c.trials["config"] == "fixed", "flags"] = ""
    assert stats.default_baseline(c) == "fixed"


def test_a_drift_line_matches_every_image_of_the_request_it_names(tmp_path):
    """The poisoned image is the second of a multi-image request: the poisoner is still found by that image."""
    camp = tmp_path / "multi"
    write_trial(
        camp,
        "a",
        0,
        manifest={},
        health=health([1, 2]),
        requests=[
            req(1, "malformed_post", S.HTTP_ERROR, 400, "h1", "dimensions", 400),
            req(2, "valid_image", hashes="h7"),
            req(3, "multi_image", hashes="h9,h1", request_id="mmc-r-0-0-3"),
        ],
        log_events=[
            {
                "t": T0 + 3.1,
                "signature": "cache_drift",
                "fatal": False,
                "mm_hash": "ab" * 8,
                "request_id": "mmc-r-0-0-3",
                "line": "drift embd-mmc-r-0-0-3",
            }
        ],
    )
    events, _ = attribute(load_results(camp))
    [ev] = events.to_dict("records")
    assert ev["match"] == SAME_IMAGE and ev["requests"] == 2  # the poisoner (h1) and the request itself
    assert "malformed_post/dimensions ×1" in ev["sent"] and "valid_image" not in ev["sent"]


# --- the cause, in the server's own words (issue 23) ---------------------------------------------------------


def test_a_poison_on_one_route_is_the_cause_of_a_drift_on_another_and_the_cause_says_which(tmp_path):
    camp = tmp_path / "routes"
    write_trial(
        camp,
        "a",
        0,
        manifest={},
        health=health([1, 2]),
        requests=[
            req(1, "malformed_post", S.HTTP_ERROR, 400, "h1", "v2_embed_output_dimension", 400, endpoint="/v2/embed"),
            req(3, "valid_image", hashes="h1", request_id="mmc-r-0-0-3", endpoint="/v1/embeddings"),
        ],
        log_events=[
            {
                "t": T0 + 3.1,
                "signature": "cache_drift",
                "fatal": False,
                "mm_hash": "ab" * 8,
                "request_id": "mmc-r-0-0-3",
                "line": "drift embd-mmc-r-0-0-3",
            }
        ],
    )
    events, _ = attribute(load_results(camp))
    [ev] = events.to_dict("records")
    assert ev["cause_endpoint"] == "/v2/embed"
    assert ev["cause"] == "malformed_post/v2_embed_output_dimension on /v2/embed (HTTP 400), 2.1 s before"


def test_the_cause_is_the_first_post_render_failure_of_the_image_the_server_named(hand):
    events, summary = attribute(load_results(hand), window_s=10)
    drift = events[(events["event"] == "drift") & (events["request_id"] == "mmc-r-0-0-5")].iloc[0]
    assert drift["cause"] == "malformed_post/dimensions (HTTP 400), 4.1 s before"
    assert (drift["cause_kind"], drift["cause_case"], drift["cause_status"]) == ("malformed_post", "dimensions", 400)
    assert drift["cause_before_s"] == pytest.approx(4.1) and drift["named_image"] == "h1"
    # the crash takes the cause of the drift line that opened its chain; it is 6 s before the crash
    crash = events[events["event"] == "crash"].iloc[0]
    assert crash["cause_kind"] == "malformed_post" and crash["cause_before_s"] == pytest.approx(6.0)
    # a drift line naming no request of ours, with an mm_hash never seen with one: no evidence, no cause
    unknown = events[(events["event"] == "drift") & events["request_id"].isna()].iloc[0]
    assert pd.isna(unknown["cause"])
    s = summary[summary["config"] == "buggy"].set_index(["event", "kind", "case"])
    assert s.loc[("drift", "malformed_post", "dimensions"), "caused"] == 1
    assert s.loc[("crash", "malformed_post", "dimensions"), "caused"] == 1
    assert s.loc[("crash", "valid_image", "—"), "caused"] == 0  # in the window, caused nothing
    assert list(summary.columns[:5]) == ["config", "event", "kind", "case", "caused"]  # lift comes after


def _trial_with(camp, requests, drift_lines, crashes=()):
    write_trial(
        camp,
        "a",
        0,
        manifest={},
        health=health([1, 2]),
        requests=requests,
        crashes=list(crashes),
        log_events=[
            {
                "t": T0 + t,
                "signature": "cache_drift",
                "fatal": False,
                "mm_hash": mm,
                "request_id": rid,
                "line": f"drift embd-{rid}",
            }
            for t, mm, rid in drift_lines
        ],
    )
    events, summary = attribute(load_results(camp), window_s=10)
    return events.set_index(events["t_rel"].round(3)).sort_index(), summary


def test_a_cause_is_the_named_image_s_not_another_image_s_of_the_request(tmp_path):
    """A line naming a one-image request tells which image an mm_hash is; a later line with that mm_hash naming
    a two-image request is the image's, not the other image's (poisoned too, but never missed)."""
    events, _ = _trial_with(
        tmp_path / "c",
        [
            req(1, "malformed_post", S.HTTP_ERROR, 400, "h1", "dimensions", 400),
            req(2, "valid_image", S.HTTP_ERROR, 503, "h1", request_id="mmc-r-0-0-2"),
            req(3, "abort", S.ABORTED, None, "h2"),
            req(4, "malformed_post", S.HTTP_ERROR, 400, "h1", "dimensions", 400),
            req(5, "multi_image", S.HTTP_ERROR, 503, "h2,h1", request_id="mmc-r-0-0-5"),
        ],
        [(2.1, "aa" * 8, "mmc-r-0-0-2"), (5.1, "aa" * 8, "mmc-r-0-0-5")],
    )
    first, second = events.loc[2.1], events.loc[5.1]
    assert first["cause_before_s"] == pytest.approx(1.1) and first["named_image"] == "h1"
    # h1's 503 at 2 s was no answer: the poison at 1 s still stands, first
    assert second["named_image"] == "h1" and second["cause_kind"] == "malformed_post"
    assert second["cause_before_s"] == pytest.approx(4.1)


def test_a_video_poisons_as_an_image_does_and_its_drift_line_names_it(tmp_path):
    """A post-render 400 on a video, then the video again (a request with no image): the line names that request,
    and its cause is the 400 (seen on 0.30.0 in the sweep test: the crash had been left unexplained)."""

    def video(t, kind, outcome, status, case=None, request_id=None):
        row = req(t, kind, outcome, status, None, case, status if case else None, request_id=request_id)
        return {**row, "n_videos": 1, "video_hashes": "v1"}

    events, _ = _trial_with(
        tmp_path / "c",
        [
            req(0.5, hashes="h1"),
            video(1, "malformed_post", S.HTTP_ERROR, 400, "video_dimensions_unsupported"),
            video(2, "video", S.HTTP_ERROR, 500, request_id="mmc-r-0-0-2"),
        ],
        [(2.1, "dd" * 8, "mmc-r-0-0-2")],
    )
    drift = events.loc[2.1]
    assert drift["named_image"] == "v1" and drift["cause_case"] == "video_dimensions_unsupported"
    assert drift["cause_before_s"] == pytest.approx(1.1)


def test_no_cause_without_a_post_render_failure_since_the_images_last_answer(tmp_path):
    """The image was answered after its poison (the engine held it then); a pre-render case does not poison; the
    request the line names is not its own cause (it timed out); a poison of an earlier server life is gone."""
    events, _ = _trial_with(
        tmp_path / "c",
        [
            req(1, "malformed_post", S.HTTP_ERROR, 400, "h1", "dimensions", 400),
            req(2, "valid_image", hashes="h1"),
            req(3, "malformed_pre", S.HTTP_ERROR, 400, "h1", "content_unknown_type", 400),
            req(4, "valid_image", S.TIMEOUT, None, "h1", request_id="mmc-r-0-0-4"),
            req(10, "abort", S.ABORTED, None, "h3"),
            req(30, "valid_image", S.HTTP_ERROR, 503, "h3", request_id="mmc-r-0-0-30"),
        ],
        [(4.5, "bb" * 8, "mmc-r-0-0-4"), (30.1, "cc" * 8, "mmc-r-0-0-30")],
        crashes=[
            {
                "t_detected": T0 + 20,
                "t_last_healthy": T0 + 19,
                "reason": "process_exit",
                "signature": "detokenizer_assert",
                "exit_code": 1,
                "restart": 0,
            }
        ],
    )
    assert pd.isna(events.loc[4.5, "cause"])
    assert pd.isna(events.loc[30.1, "cause"])  # the abort at 10 s was the server's before the crash at 20 s


def test_an_image_s_first_two_uses_at_once_are_the_cause_when_nothing_failed(tmp_path):
    """Measured on 0.30.0 with no poison in the mix: a batch and a single request carried a new image 0.2 ms
    apart; the single one was missed. No use had failed, none had been answered before it: a race of first uses,
    named with the other request. Once the image had been answered, a later miss has no such cause."""
    events, summary = _trial_with(
        tmp_path / "c",
        [
            req(2.0, "batch", S.HTTP_ERROR, 500, "h1,h2,h3", latency=30),
            req(2.0002, "valid_image", S.HTTP_ERROR, 500, "h1", latency=30, request_id="mmc-r-0-0-2"),
            req(5.0, "valid_image", hashes="h4", latency=20),  # answered at 5.02: the engine holds h4
            req(6.0, "valid_image", S.HTTP_ERROR, 503, "h4", request_id="mmc-r-0-0-6"),
            req(6.0001, "multi_image", S.HTTP_ERROR, 503, "h4,h5"),
        ],
        [(2.1, "aa" * 8, "mmc-r-0-0-2"), (6.1, "bb" * 8, "mmc-r-0-0-6")],
    )
    race = events.loc[2.1]
    assert (race["cause_kind"], race["cause_case"], race["cause_status"]) == (cause_rule.AT_ONCE, "batch", 500)
    assert race["cause"].startswith("the image's first use at once with batch (HTTP 500)")
    assert pd.isna(events.loc[6.1, "cause"])  # h4 was answered before: no race of first uses, no failure
    s = summary.set_index(["event", "kind", "case"])
    assert s.loc[("drift", cause_rule.AT_ONCE, "batch"), "caused"] == 1
    words = report.write_report(tmp_path / "c").markdown.read_text().split("In plain words:")[1].split("\n\n")[1]
    assert "1 of 2 drift lines caused by the image's first two uses at once, one of them batch" in words, words


def test_each_named_image_is_followed_alone(tmp_path):
    """Seen on 0.30.0: a multi-image request missed; one of its images was new and had just failed after render,
    the other was in use and answered since. The answered image says nothing of the new one: the 400 is the cause."""
    events, _ = _trial_with(
        tmp_path / "c",
        [
            req(1.0, "valid_image", hashes="old", latency=10),
            req(6.6, "malformed_post", S.HTTP_ERROR, 400, "new", "dimensions", 400, latency=10),
            req(6.9, "valid_image", hashes="old", latency=10),
            req(7.0, "multi_image", S.HTTP_ERROR, 500, "new,old,old", request_id="mmc-r-0-0-7"),
        ],
        [(7.05, "cc" * 8, "mmc-r-0-0-7")],
    )
    drift = events.loc[7.05]
    assert (drift["cause_kind"], drift["cause_case"]) == ("malformed_post", "dimensions")
    assert drift["cause_before_s"] == pytest.approx(0.45)


def test_plain_words_name_the_cause_and_never_a_pre_render_case_from_two_incidents(tmp_path):
    """The issue's case: two crashes, a pre-render case in both windows; the drift lines name an image whose
    post-render 400 came 30 s earlier, outside every window."""
    camp = tmp_path / "words"
    for trial in (0, 1):
        write_trial(
            camp,
            "v",
            trial,
            manifest={"t_start": T0, "t_end": T0 + 600},
            health=health([1, 50]),
            requests=[
                # the poison went through /score in one trial: the crash came through /v1/embeddings all the same
                req(
                    10,
                    "malformed_post",
                    S.HTTP_ERROR,
                    400,
                    "h1",
                    "dimensions",
                    400,
                    endpoint=("/v1/embeddings", "/score")[trial],
                ),
                *[req(11 + i, "valid_image", hashes=f"k{i}") for i in range(20)],
                req(39, "malformed_pre", S.HTTP_ERROR, 400, "h5", "content_unknown_type", 400),
                req(40, "valid_image", S.CONNECTION_ERROR, None, "h1", request_id=f"mmc-r-0-{trial}-40"),
            ],
            log_events=[
                {
                    "t": T0 + 40.1,
                    "signature": "cache_drift",
                    "fatal": False,
                    "mm_hash": "dd" * 8,
                    "request_id": f"mmc-r-0-{trial}-40",
                    "line": "drift",
                }
            ],
            crashes=[
                {
                    "t_detected": T0 + 41,
                    "t_last_healthy": T0 + 40.5,
                    "reason": "process_exit",
                    "signature": "detokenizer_assert",
                    "exit_code": 1,
                    "restart": 0,
                }
            ],
        )
    md = report.write_report(camp).markdown.read_text()
    words = md.split("In plain words:")[1].split("\n\n")[1]
    assert "2 of 2 crashes caused by malformed_post/dimensions" in words, words
    assert "malformed_pre" not in words, words
    # a failing configuration is said to fail by what happened, not by the name of the check it failed
    assert words.startswith("- v: fails — the server crashed in 2 of 2 trial(s)"), words
    assert "FAILS" not in words and "(failed:" not in words, words
    assert "malformed_post/dimensions on /score (HTTP 400), 30.1 s before" in md  # the incidents table's cause column
    card = md.split("In plain words:")[0]
    assert "crashed through " in card and "/score (1)" in card and "/v1/embeddings (1)" in card, card


def test_a_wrong_answer_fails_its_configuration_in_plain_words(tmp_path):
    """Every check a configuration can fail has its plain words (a wrong answer had none: the report died on it)."""
    camp = tmp_path / "wrong"
    wrong = {**req(3), "consistent": False, "error": "wrong answer: cosine 0.94 with this input's first answer"}
    write_trial(
        camp,
        "v",
        0,
        manifest={"t_start": T0, "t_end": T0 + 60},
        health=health([1, 50]),
        requests=[req(1), {**req(2), "consistent": True}, wrong],
    )
    words = report.write_report(camp).markdown.read_text().split("In plain words:")[1].split("\n\n")[1]
    assert words.startswith("- v: fails — a repeated input got a different answer"), words


def test_a_pre_render_case_is_never_named_by_lift_and_lift_needs_five_incidents(tmp_path):
    """Crashes without a drift line (no evidence): a valid kind seen before both is not named from two; a
    malformed_pre seen before all six is never named."""
    camp = tmp_path / "lift"
    for trial in range(6):
        write_trial(
            camp,
            "v",
            trial,
            manifest={"t_start": T0, "t_end": T0 + 600},
            health=health([1, 50]),
            requests=[
                *[req(1 + i, "text", hashes=None) for i in range(30)],
                req(39, "malformed_pre", S.HTTP_ERROR, 400, "h5", "content_unknown_type", 400),
            ],
            crashes=[
                {
                    "t_detected": T0 + 41,
                    "t_last_healthy": T0 + 40.5,
                    "reason": "process_exit",
                    "signature": "detokenizer_assert",
                    "exit_code": 1,
                    "restart": 0,
                }
            ],
        )
    words = report.write_report(camp).markdown.read_text().split("In plain words:")[1].split("\n\n")[1]
    assert "preceded" not in words and "caused" not in words, words


def test_the_first_screen_is_a_card_per_configuration(tmp_path):
    """Before any table: per configuration its verdict, why, its crashes at the one rate the report uses, its cost,
    and its first crash's trial folder with the command that shrinks it."""
    cfgs = (SyntheticConfig("default", crash_per_hour=40.0), SyntheticConfig("off", ["--mm-processor-cache-gb", "0"]))
    camp = make_campaign(tmp_path, "c", cfgs, trials=2, requests_per_trial=300, duration_s=300)
    res = report.write_report(camp, baseline="off")
    md = res.markdown.read_text()
    head = md.split("What this measures")[0]
    verdicts = res.verdicts
    for cfg in ("default", "off"):
        assert f"**{cfg}: {verdicts[cfg]}**" in head
    assert head.count("crashes per hour of uptime") == 2 and "crashes / hour" not in md
    [folder] = re.findall(r"shrink its first crash: mmchaos minimize (\S+)", head)
    assert Path(folder).parent.name == "default" and (Path(folder) / "manifest.json").is_file()
    assert "the baseline the costs are measured against" in head.split("**off:")[1]
    assert '<div class="cards">' in res.html.read_text()
    # then the one figure that compares them: crash rate against cost; with one configuration there is none
    assert "(tradeoff.png)" in head and (res.out_dir / "tradeoff.png").stat().st_size > 0
    alone = report.write_report(make_campaign(tmp_path, "one", cfgs[:1], trials=1, requests_per_trial=200))
    assert "tradeoff.png" not in alone.markdown.read_text()


def test_a_campaign_that_is_no_sweep_gets_no_hazard_curve(tmp_path):
    """One point per configuration: p has no curve over knobs, so no near-empty figure (the section says why)."""
    camp = make_campaign(tmp_path, "c", trials=2, requests_per_trial=300, duration_s=300)
    res = report.write_report(camp)
    md = res.markdown.read_text()
    assert "## Crash hazard per poison event" in md and "Not a sweep" in md
    assert "crash_hazard.png" not in md and not (res.out_dir / "crash_hazard.png").exists()


def test_a_crash_is_shown_by_the_lines_that_tell_it_not_by_the_logs_end(tmp_path):
    """The report shows the traceback that led to the fatal line, not what the server printed while it was stopped
    (teardown warnings), which is the end of its log."""
    cfgs = (SyntheticConfig("default", crash_per_hour=400.0),)
    camp = make_campaign(tmp_path, "c", cfgs, trials=1, duration_s=300, interrupt_last=False)
    log = camp / "default" / "t000" / "server.log"
    before = log.read_text().splitlines()
    teardown = [f"resource_tracker: There appear to be {k} leaked shared_memory objects" for k in range(60)]
    story = ["(APIServer pid=9) ERROR [a.py:1] Traceback (most recent call last):", '  File "x.py", line 1, in f']
    fatal = next(i for i, line in enumerate(before) if "req_state.detokenizer" in line)
    log.write_text("\n".join([*before[:fatal], *story, *before[fatal:], *teardown]) + "\n")
    md = report.write_report(camp).markdown.read_text()
    section = md.split("### How the server died: default trial 0")[1].split("###")[0]
    assert "Traceback (most recent call last)" in section and "req_state.detokenizer is not None" in section
    assert "leaked shared_memory" not in section
