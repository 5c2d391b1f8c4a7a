"""analysis/exposure.py, hazard.py and prediction.py: the exposure (poison events, uptime) against ground truth and
a slow reference, the crash-hazard fit against campaigns with a known p (one draw and the coverage over many), the
degenerate cases, predict's arithmetic, the held-out check, the command and the report section. No server, fixed
seeds."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from cli_inprocess import mmchaos
from scipy import stats
from synthetic_sweep import SweepConfig, make_sweep_campaign, read_truth

from mmchaos import schema as S
from mmchaos.analysis import exposure as X
from mmchaos.analysis import hazard as H
from mmchaos.analysis import intervals as I
from mmchaos.analysis import prediction as P
from mmchaos.analysis.document import Doc
from mmchaos.analysis.results import CampaignResults, load_results
from mmchaos.analysis.sections_hazard import hazard_section, sentence
from mmchaos.verdict_rule import is_poison

P_DEFAULT, USERS_SLOPE = 0.3, 0.05  # the known hazard of the synthetic "v0.30-default"
CONFIGS = [
    SweepConfig("v0.30-default", P_DEFAULT, slopes={"users": USERS_SLOPE}, reference={"users": 8}),
    SweepConfig("v0.30-cache-off", 0.0, flags=["--mm-processor-cache-gb", "0"]),
    SweepConfig("always", 1.0),
]
SWEEP = {"malformed_post": [1, 2, 5], "users": [4, 8, 16]}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    return make_sweep_campaign(tmp_path_factory.mktemp("hz"), CONFIGS, SWEEP, trials_per_point=2, seed=7)


@pytest.fixture(scope="module")
def results(campaign):
    return load_results(campaign)


@pytest.fixture(scope="module")
def fit(results):
    return H.fit_hazard(results)


def frame(events, crashes, config="a", **knobs) -> pd.DataFrame:
    """An exposure table by hand: one row per trial."""
    events = np.asarray(events)
    n = len(events)
    d = pd.DataFrame(
        {
            "config": config,
            "trial": np.arange(n),
            **{k: np.asarray(v, float) for k, v in knobs.items()},
            "engine": "0.30.0",
            "target": "engine",
            "users": 8.0,
            "duration_s": 600.0,
            "uptime_s": 600.0,
            "answered": 1000,
            "valid_answered": 900,
            "poison_requests": 2 * events,
            "poison_events": events,
            "reuse_share": 0.5,
            "crashes": np.asarray(crashes),
        }
    )
    if "users" in knobs:
        d["users"] = np.asarray(knobs["users"], float)
    return d


# --- exposure -----------------------------------------------------------------------------------------


def test_trials_carry_the_sweep_point(results):
    points = results.trials["sweep"].map(json.loads)
    assert {tuple(sorted(p)) for p in points} == {("malformed_post", "users")}
    assert set(points.map(lambda p: p["users"])) == {4, 8, 16}


def test_exposure_matches_what_the_generator_did(results, campaign):
    exp = X.exposure(results)
    assert X.knob_columns(exp) == ["malformed_post"]  # users is the users column
    m = exp.merge(read_truth(campaign), on=["config", "trial"], suffixes=("", "_true"))
    assert len(m) == len(exp) == 3 * 9 * 2
    for col in ("poison_requests", "poison_events", "crashes"):
        assert (m[col] == m[col + "_true"]).all(), col
    assert (exp["reused_poison"] == exp["poison_events"]).all()  # every poisoned image here is a fresh one
    assert np.allclose(m["uptime_s"], m["uptime_s_true"], atol=1e-3)
    assert (m["users"] == m["sweep"].map(lambda p: p["users"])).all()
    assert exp["answered"].gt(0).all() and (exp["valid_answered"] <= exp["answered"]).all()


def _slow_exposure(c: CampaignResults) -> pd.DataFrame:
    """The definition, row by row (quadratic; small campaigns only)."""
    out = []
    for tr in c.trials.itertuples():
        r = c.requests[(c.requests["config"] == tr.config) & (c.requests["trial"] == tr.trial)]
        cr = sorted(c.crashes.loc[(c.crashes["config"] == tr.config) & (c.crashes["trial"] == tr.trial), "t_detected"])
        ok = sorted(
            c.health.loc[
                (c.health["config"] == tr.config) & (c.health["trial"] == tr.trial) & c.health["ok"].eq(True), "t"
            ]
        )
        end = tr.t_start + tr.duration_s
        down = []
        for t in cr:
            back = min([x for x in ok if x > t] + [end])
            down.append((max(t, tr.t_start), min(back, end)))
        covered = sum(
            max(0.0, b - max(a, max([d[1] for d in down[:i]], default=-np.inf))) for i, (a, b) in enumerate(down)
        )

        def life(t, cr=cr):
            return sum(x <= t for x in cr)

        rows = list(r.itertuples())
        imgs = [set(x.image_hashes.split(",")) if isinstance(x.image_hashes, str) else set() for x in rows]

        def bad(x):  # a poison request that counts: not cut by the run's end, not failed by the server
            return is_poison(x.kind, x.case) and x.outcome != S.CUT and x.cause != S.SERVER

        def reaches(y):  # its images get to the engine
            return not is_poison(y.kind, y.case) and y.kind not in ("malformed_pre", "tokenize")

        poison = reused = events = 0
        for i, x in enumerate(rows):
            if not bad(x):
                continue
            poison += 1
            same_life = [(j, y) for j, y in enumerate(rows) if life(y.t_start) == life(x.t_start)]
            again = {h for j, y in same_life if reaches(y) and y.t_start > x.t_start for h in imgs[j] & imgs[i]}
            cached = {
                h
                for j, y in same_life
                if reaches(y) and y.t_start < x.t_start and 200 <= (y.status or 0) < 300
                for h in imgs[j]
            }
            poisoned_before = {h for j, y in same_life if bad(y) and y.t_start < x.t_start for h in imgs[j]}
            reused += bool(again)
            events += bool(again - cached - poisoned_before)
        out.append(
            {
                "poison_requests": poison,
                "reused_poison": reused,
                "poison_events": events,
                "crashes": len(cr),
                "uptime_s": tr.duration_s - covered,
                "answered": int(r["status"].notna().sum()),
            }
        )
    return pd.DataFrame(out)


def test_exposure_agrees_with_the_definition_row_by_row():
    """Multi-image requests, probes, cut and server-failed poison, several crashes and missing health polls."""
    rng = np.random.default_rng(3)
    trials, reqs, crashes, health = [], [], [], []
    kinds = ["valid_image", "multi_image", "malformed_post", "abort", "probe", "text", "malformed_pre"]
    for cfg in ("x", "y"):
        for trial in range(3):
            t0 = 1_700_000_000.0 + 1000 * trial + (50_000 if cfg == "y" else 0)
            trials.append(
                {
                    "config": cfg,
                    "trial": trial,
                    "t_start": t0,
                    "duration_s": 300.0,
                    "users": 4,
                    "sweep": json.dumps({"abort": trial}),
                    "engine": "0.30.0",
                    "target": "engine",
                }
            )
            ct = np.sort(rng.uniform(0, 300, trial + 1))[:trial]  # 0, 1, 2 crashes
            crashes += [{"config": cfg, "trial": trial, "t_detected": t0 + t} for t in ct]
            polls = np.arange(0, 300, 2.0)
            health += [
                {
                    "config": cfg,
                    "trial": trial,
                    "t": t0 + t,
                    "ok": not any(0 <= t - c < 7 for c in ct) and rng.random() > 0.1,
                }
                for t in polls
            ]
            for _ in range(150):
                kind = rng.choice(kinds)
                case = rng.choice(["poison", "reuse", "abort", "tokenize"]) if kind == "probe" else None
                k = 3 if kind == "multi_image" else 0 if kind == "text" else 1
                hashes = ",".join(f"h{rng.integers(12)}" for _ in range(k)) or None
                outcome = rng.choice([S.OK, S.HTTP_ERROR, S.ABORTED, S.CUT, S.CONNECTION_ERROR])
                cause = {S.OK: None, S.CUT: S.HARNESS, S.CONNECTION_ERROR: S.SERVER}.get(
                    outcome, rng.choice([S.CLIENT, S.SERVER])
                )
                status = 200.0 if outcome == S.OK else 400.0 if outcome == S.HTTP_ERROR else np.nan
                reqs.append(
                    {
                        "config": cfg,
                        "trial": trial,
                        "kind": kind,
                        "case": case,
                        "t_start": t0 + rng.uniform(0, 300),
                        "status": status,
                        "outcome": outcome,
                        "cause": cause,
                        "image_hashes": hashes,
                    }
                )

    def cats(d, cols):  # categorical, as loaded
        return d.assign(**{c: d[c].astype("category") for c in cols})

    c = CampaignResults(
        "hand",
        None,
        ["x", "y"],
        pd.DataFrame(trials),
        cats(pd.DataFrame(reqs), ["config", "kind", "case", "outcome"]),
        pd.DataFrame(health),
        pd.DataFrame(),
        pd.DataFrame(),
        pd.DataFrame(crashes),
    )
    fast, slow = X.exposure(c), _slow_exposure(c)
    assert slow["reused_poison"].sum() > slow["poison_events"].sum() > 5 and slow["crashes"].sum() == 6
    for col in slow.columns:
        assert np.allclose(fast[col].to_numpy(float), slow[col].to_numpy(float)), col
    assert list(fast["abort"]) == [0, 1, 2, 0, 1, 2]


# --- the fit against a known p ------------------------------------------------------------------------


def test_fit_recovers_the_known_hazard(fit):
    f = fit["v0.30-default"]
    assert f.model in (H.POISSON, H.NEGBIN) and f.terms == ["malformed_post", "users"]
    assert f.reference == {"malformed_post": 2.0, "users": 8.0}
    assert f.p_lo < P_DEFAULT < f.p_hi  # p at the reference users = 8 is the generator's p
    users = f.coefs.set_index("term").loc["users"]
    assert users["role"] == "concurrency"
    assert users["per_unit_lo"] < np.exp(USERS_SLOPE) < users["per_unit_hi"]
    assert users["over_range_lo"] > 1  # the generator's p does rise with users: the fit says so
    mix = f.coefs.set_index("term").loc["malformed_post"]
    assert mix["per_unit_lo"] < 1 < mix["per_unit_hi"]  # p per event does not depend on how many events
    assert abs(f.reuse_share - 0.6) < 0.05
    for q in ("deviance_df", "pearson_df"):
        assert 0 < f.quality[q] < 2
    assert np.isfinite(f.quality["aic_poisson"])
    # the rates the report's crash table shows: every crash over all uptime / answered requests, exact
    est, lo, hi = I.poisson_rate_ci(f.counts["crashes"], f.counts["uptime_s"] / 3600, 1.0)
    assert (f.rates["per_hour"], f.rates["per_hour_lo"], f.rates["per_hour_hi"]) == pytest.approx((est, lo, hi))
    # the fitted p at each sweep point sits inside the measured one's interval, mostly
    pts = f.points
    assert ((pts["fit"] >= pts["p_lo"]) & (pts["fit"] <= pts["p_hi"])).mean() >= 0.8


def test_no_crash_gives_the_exact_upper_bound(fit):
    f = fit["v0.30-cache-off"]
    assert f.model == H.NO_CRASH and f.p == 0 and f.p_lo == 0
    assert f.p_hi == pytest.approx(stats.chi2.ppf(0.975, 2) / 2 / f.counts["poison_events"])
    assert "at most" in sentence(f)


def test_every_event_crashing_gives_the_exact_binomial(fit):
    f = fit["always"]
    n = f.counts["poison_events"]
    assert f.model == H.ALL_CRASHED and f.p == 1 and f.p_hi == 1
    assert f.p_lo == pytest.approx(0.025 ** (1 / n))  # Clopper-Pearson at k = n
    assert "every one of" in sentence(f)


def test_degenerate_configurations():
    one = H.fit_config(frame([40], [10]), "a")
    assert one.model == H.POISSON and one.p == pytest.approx(0.25) and one.terms == []
    assert (one.p_lo, one.p_hi) == pytest.approx(tuple(I.poisson_rate_ci(10, 40)[1:]))
    assert np.isnan(one.quality["pearson_df"]) and "one trial" in one.why

    none = H.fit_config(frame([0, 0], [0, 1]), "a")
    assert none.model == H.NO_DATA and np.isnan(none.p) and none.counts["trials_no_poison"] == 2
    assert "no poison request" in sentence(none)

    dropped = H.fit_config(frame([30, 0, 50, 0], [6, 1, 10, 0]), "a")
    assert dropped.counts["trials_used"] == 2 and dropped.counts["trials_no_poison"] == 2
    assert dropped.p == pytest.approx(16 / 80) and dropped.counts["crashes"] == 17
    assert any("2 of 4 trials" in n and "another cause" in n for n in dropped.notes)

    # crashes only at the top of the range: the slope has no finite estimate, the fit pools instead of failing
    sep = H.fit_config(frame([50] * 6, [0, 0, 0, 0, 9, 7], users=[4, 4, 8, 8, 16, 16]), "a")
    assert sep.terms == [] and sep.p == pytest.approx(16 / 300)
    assert any("pooled" in n for n in sep.notes)

    shapes = frame([50] * 4, [5, 6, 4, 5])
    shapes["shape"] = ["steady", "spike", "steady", "spike"]  # a knob that is not a number: pooled, and said
    odd = H.fit_config(shapes, "a")
    assert odd.terms == [] and odd.p == pytest.approx(0.1) and any("shape varied" in n for n in odd.notes)

    high = H.fit_config(frame([20, 20, 20], [19, 20, 18]), "a")  # near 1: the rate's interval passes 1
    assert high.p_hi > 1 and any("close to 1" in n for n in high.notes)
    assert "capped at 1" in sentence(high)


def test_dispersion_decides_between_poisson_and_negative_binomial():
    rng = np.random.default_rng(11)
    e = np.full(30, 200)
    plain = H.fit_config(frame(e, rng.poisson(e * 0.1)), "a")
    assert plain.model == H.POISSON and "does not lower the AIC" in plain.why
    wild = H.fit_config(frame(e, rng.poisson(e * 0.1 * rng.gamma(1.0, 1.0, 30))), "a")  # p differs per trial
    assert wild.model == H.NEGBIN and wild.quality["aic_nb"] < wild.quality["aic_poisson"] and wild.alpha > 0
    assert wild.p_lo < 0.1 < wild.p_hi


def _coverage(make, truth, n=200) -> float:
    hits = 0
    for i in range(n):
        f = H.fit_config(make(np.random.default_rng([2024, i])), "a")
        hits += f.p_lo <= truth <= f.p_hi
    return hits / n


def test_intervals_cover_the_truth_at_the_promised_rate():
    """Over 200 simulated campaigns, the 95 % interval of p holds the true p 90-99 % of the time."""
    p = 0.05

    def pooled(rng):  # no knob: the exact interval
        e = rng.poisson(80, 6)
        return frame(e, rng.binomial(e, p))

    def with_users(rng):  # users varies: the GLM's Wald interval at the reference users = 8
        users = np.tile([4.0, 8.0, 16.0], 4)
        e = rng.poisson(80, 12)
        return frame(e, rng.binomial(e, p * np.exp(0.08 * (users - 8))), users=users)

    assert 0.90 <= _coverage(pooled, p) <= 0.99
    assert 0.90 <= _coverage(with_users, p) <= 0.99


# --- predict ------------------------------------------------------------------------------------------


def test_predict_mtbf_by_hand():
    fit = H.fit_exposure(frame([50, 50], [12, 8]))  # p = 20/100, reuse share 100/200
    pr = P.predict(fit, rps=10, post_render_share=0.02, disconnect_share=0.01)
    r = pr.table.iloc[0]
    _, lo, hi = I.poisson_rate_ci(20, 100)
    events = 10 * (0.02 + 0.01) * 0.5  # 0.15 poison events per second
    assert r["poison_per_s"] == pytest.approx(events)
    assert r["mtbf_s"] == pytest.approx(1 / (events * 0.2))  # 33.3 s
    assert r["mtbf_lo_s"] == pytest.approx(1 / (events * hi))
    assert r["mtbf_hi_s"] == pytest.approx(1 / (events * lo))
    assert r["crashes_per_hour"] == pytest.approx(3600 * events * 0.2)
    assert P.predict(fit, 10, 0.02, 0.01, reuse=1.0).table["mtbf_s"].iat[0] == pytest.approx(1 / (0.3 * 0.2))
    assert "33.3 s" in pr.lines()[0]
    assert any("tiny random-weight model on CPU" in c for c in pr.caveats)
    assert any("concurrency" in c and "was not varied" in c for c in pr.caveats)
    far = P.predict(fit, rps=5000, post_render_share=0.02, disconnect_share=0.01)
    assert any("far extrapolation" in c for c in far.caveats)


def test_predict_takes_p_at_the_closest_measured_knobs():
    users = [4, 4, 8, 8, 16, 16]
    fit = H.fit_exposure(frame([100] * 6, [5, 7, 10, 11, 20, 22], users=users))
    f = fit["a"]
    assert f.terms == ["users"]
    pr = P.predict(fit, 1.0, 0.1, 0.0, knobs={"users": 64})
    r = pr.table.iloc[0]
    assert r["at"] == "users=16" and r["p"] == pytest.approx(f.p_at({"users": 16})[0])
    assert any("users=64 was not measured" in c for c in pr.caveats)
    assert P.predict(fit, 1.0, 0.1, 0.0).table["p"].iat[0] == pytest.approx(f.p)  # the reference, users = 8


def test_predict_without_a_crash_is_a_lower_bound():
    fit = H.fit_exposure(frame([100, 100], [0, 0]))
    r = P.predict(fit, 2.0, 0.05, 0.05).table.iloc[0]
    assert np.isinf(r["mtbf_s"]) and np.isinf(r["mtbf_hi_s"])
    assert r["mtbf_lo_s"] == pytest.approx(1 / (2.0 * 0.1 * 0.5 * I.poisson_rate_ci(0, 200)[2]))
    assert "at least" in P.predict(fit, 2.0, 0.05, 0.05).lines()[0]


def test_predict_refuses_impossible_traffic():
    fit = H.fit_exposure(frame([50], [5]))
    for args in ((0, 0.1, 0.1), (10, 1.5, 0), (10, 0.6, 0.6)):
        with pytest.raises(ValueError):
            P.predict(fit, *args)
    with pytest.raises(ValueError):
        P.predict(fit, 10, 0.1, 0.1, reuse=2)


# --- held out -----------------------------------------------------------------------------------------


def test_held_out_point_by_hand():
    d = frame([100, 100, 100, 300], [10, 10, 10, 30], users=[4, 4, 8, 8])  # p 0.1 everywhere
    h = P.held_out(d, "a", {"users": 8})
    assert h.trials == 2 and h.measured == 40 and h.poison_events == 400
    # fitted on users = 4 alone (users no longer varies: intercept only): p = 20/200, so 400 events -> 40 crashes
    assert h.p == pytest.approx(0.1) and h.predicted == pytest.approx(40.0) and h.model == H.POISSON
    assert h.lo < 40 < h.hi and h.inside
    # the interval is predictive: wider than the Poisson noise of a known p alone
    assert h.lo < stats.poisson.ppf(0.025, 40) and h.hi > stats.poisson.ppf(0.975, 40)
    with pytest.raises(ValueError):
        P.held_out(d, "a", {"users": 32})


def test_held_out_sweep_points_are_predicted(results):
    for point in ({"users": 8}, {"malformed_post": 5, "users": 16}):
        h = P.held_out(results, "v0.30-default", point)
        assert h.inside, h
        assert h.lo < P_DEFAULT * np.exp(USERS_SLOPE * (point["users"] - 8)) * h.poison_events < h.hi


# --- the report section -------------------------------------------------------------------------------


def test_section_says_it_plainly(results, fit):
    doc = Doc("hazard")
    hazard_section(doc, results, fit)
    md = doc.to_markdown()
    assert "v0.30-default: each poison event crashed the server with probability" in md
    assert "v0.30-cache-off: no crash in" in md and "always: every one of the" in md
    assert "Crash hazard per configuration" in md and "ratio across the range" in md
    png = doc.images()["crash_hazard.png"]
    assert png.startswith(b"\x89PNG")
    assert "<h2" in doc.to_html()


# --- the report's crash table: rates over the exposure the server really had ----------------------------------


def test_crash_table_rates_count_only_uptime_and_answered_requests(results, campaign):
    from mmchaos.analysis import stats

    cs = stats.crash_stats(results).set_index("config")
    truth = read_truth(campaign).groupby("config")[["crashes", "uptime_s"]].sum()
    answered = results.requests["status"].notna().groupby(results.requests["config"], observed=True).sum()
    for cfg in ("v0.30-default", "always"):
        row = cs.loc[cfg]
        assert row["uptime_hours"] == pytest.approx(truth.loc[cfg, "uptime_s"] / 3600, rel=1e-6)
        assert row["answered"] == answered[cfg]
        est, lo, hi = I.poisson_rate_ci(truth.loc[cfg, "crashes"], truth.loc[cfg, "uptime_s"] / 3600, 1.0)
        assert (row["per_hour_up"], row["per_hour_up_lo"], row["per_hour_up_hi"]) == pytest.approx((est, lo, hi))
        assert row["per_1k_answered"] == pytest.approx(1000 * truth.loc[cfg, "crashes"] / answered[cfg])
        # the restarts were down time and refusals: per hour of uptime is higher than per hour of load
        assert row["per_hour_up"] > row["per_hour"] and row["per_1k_answered"] > row["per_1k_requests"]
    assert cs.loc["v0.30-cache-off", "per_hour_up"] == 0


# --- predict: shares as people write them, the held-out table, the command -----------------------------------


@pytest.mark.parametrize("text,value", [("0.5%", 0.005), ("0.005", 0.005), ("1 %", 0.01), ("100%", 1.0), ("0", 0.0)])
def test_shares_are_read_as_written(text, value):
    assert P.parse_share(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "150%", "-1%", "half", "", "nan"])
def test_impossible_shares_are_refused(text):
    with pytest.raises(ValueError, match="share"):
        P.parse_share(text)


def test_every_held_out_point_is_predicted_within_its_interval(results, fit):
    held = P.held_out_table(X.exposure(results), fit)
    default = held[held["config"] == "v0.30-default"]
    assert len(default) == 9  # 3 × 3 points, each predicted by the other eight
    assert default["inside"].mean() >= 0.8  # 95 % intervals: one miss in nine is chance
    assert (default["lo"] <= default["predicted"]).all() and (default["predicted"] <= default["hi"]).all()
    # the cache-off configuration never crashed: every held-out point predicts 0 crashes, and measured 0
    off = held[held["config"] == "v0.30-cache-off"]
    assert len(off) == 9 and (off["measured"] == 0).all() and off["inside"].all()


def test_predict_command_prints_mtbf_caveats_and_held_out_check(campaign, fit, capsys):
    from mmchaos.harness import cli

    code = cli.main(
        [
            "predict",
            str(campaign),
            "--rps",
            "200",
            "--post-render-4xx",
            "0.5%",
            "--disconnects",
            "0.01",
            "--config",
            "v0.30-default",
            "--config",
            "v0.30-cache-off",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    want = P.predict(H.fit_exposure(fit.exposure, ["v0.30-default", "v0.30-cache-off"]), 200, 0.005, 0.01)
    r = want.table.set_index("config").loc["v0.30-default"]
    line = next(x for x in out if x.startswith("v0.30-default: mean time between crashes"))
    assert P.duration(r["mtbf_s"]) in line and P.duration(r["mtbf_lo_s"]) in line
    assert any(x.startswith("v0.30-cache-off: mean time between crashes at least") for x in out)
    assert not any(x.startswith("always") for x in out)  # --config chose two
    assert sum(x.startswith("caveat: ") for x in out) == len(want.caveats)
    assert any(x.startswith("held-out check (") for x in out)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--rps", "200", "--post-render-4xx", "5"], "is not a share between 0 and 100 %"),
        (["--rps", "0", "--disconnects", "1%"], "is not a request rate above 0"),
        (["--rps", "200"], "--post-render-4xx and/or --disconnects"),
        (["--rps", "200", "--disconnects", "1%", "--at", "users"], "write KNOB=NUMBER"),
        (["--rps", "200", "--disconnects", "1%", "--config", "nope"], "--config nope: no such configuration"),
    ],
)
def test_predict_refuses_bad_input_in_one_line(campaign, args, needle, capsys):
    from mmchaos.harness import cli

    try:
        code = cli.main(["predict", str(campaign), *args])
    except SystemExit as e:  # argparse's own errors (one line too, see cli._Parser)
        code = e.code
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    [line] = out.err.strip().splitlines()
    assert needle in line


def test_predict_on_a_folder_that_is_no_campaign_is_one_line_and_exit_2(tmp_path):
    p = mmchaos("predict", str(tmp_path), "--rps", "10", "--disconnects", "1%")
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr
    [line] = p.stderr.strip().splitlines()
    assert line.startswith("mmchaos: no trials found in")


def test_the_report_fits_the_hazard_and_predicts_on_request(campaign, tmp_path):
    from mmchaos.analysis import report

    res = report.write_report(
        campaign,
        tmp_path / "r",
        traffic={"rps": 50, "post_render_share": 0.01, "disconnect_share": 0.0, "reuse": None, "knobs": {"users": 16}},
    )
    md = res.markdown.read_text()
    crashes, hazard = md.index("## Crashes"), md.index("## Crash hazard per poison event")
    assert crashes < hazard < md.index("## Time and requests to the first crash")  # right after the crashes
    assert "per hour of uptime" in md[crashes:hazard] and "per 1,000 answered" in md[crashes:hazard]
    assert "Held-out sweep points: predicted against measured" in md
    assert "### At your traffic" in md and "Predicted mean time between crashes" in md
    assert "| malformed_post=2, users=16 |" in md  # p is taken at the user's concurrency, the reference mix
    with pytest.raises(report.ReportError, match="traffic to predict at"):
        report.write_report(
            campaign, tmp_path / "bad", traffic={"rps": -1, "post_render_share": 0.01, "disconnect_share": 0.0}
        )


# --- predict checked against a campaign at a rate the fit never saw ----------------------------------------


def check_campaign(tmp_path, p_default: float, seed: int):
    """The user's rate, open loop: three times the sweep's poison traffic, at users = 8, no sweep."""
    cfgs = [SweepConfig("v0.30-default", p_default), SweepConfig("always", 1.0)]
    return load_results(
        make_sweep_campaign(
            tmp_path,
            cfgs,
            {},
            name="at-rate",
            trials_per_point=3,
            seed=seed,
            poison_per_s=0.15,
            valid_per_s=3.0,
            rate=3.15,
        )
    )


def test_a_campaign_at_a_new_rate_measures_what_the_fit_predicts(fit, tmp_path):
    check = P.rate_check(fit, check_campaign(tmp_path, P_DEFAULT, seed=11))
    assert list(check["config"]) == ["v0.30-default", "always"]  # cache-off was not run at the rate
    for r in check.itertuples(index=False):
        assert r.rate == "3.15" and r.trials == 3 and r.measured > 0
        assert r.inside, r
        assert r.per_hour_lo <= r.predicted_per_hour <= r.per_hour_hi, r  # crashes per hour, measured directly


def test_a_campaign_at_a_new_rate_catches_a_wrong_fit(fit, tmp_path):
    # the server at the user's rate crashes per poison event three times as often as the sweep said
    check = P.rate_check(fit, check_campaign(tmp_path, 0.9, seed=12)).set_index("config")
    assert not check.loc["v0.30-default", "inside"]
    assert check.loc["v0.30-default", "measured"] > check.loc["v0.30-default", "hi"]


def test_predict_check_prints_the_measured_rate_and_refuses_a_bad_folder(campaign, tmp_path, capsys):
    from mmchaos.harness import cli

    check = tmp_path / "c"
    check.mkdir()
    make_sweep_campaign(
        check,
        [SweepConfig("always", 1.0)],
        {},
        name="at-rate",
        trials_per_point=2,
        seed=5,
        poison_per_s=0.15,
        valid_per_s=3.0,
        rate=3.15,
    )
    code = cli.main(
        ["predict", str(campaign), "--rps", "200", "--post-render-4xx", "0.5%", "--check", str(check / "at-rate")]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    i = next(i for i, x in enumerate(out) if x.startswith("checked at a measured rate (1 of 1 inside)"))
    assert out[i + 1].startswith("  always at 3.15 requests/s: measured ") and len(out) == i + 2
    code = cli.main(
        ["predict", str(campaign), "--rps", "200", "--post-render-4xx", "0.5%", "--check", str(tmp_path / "none")]
    )
    err = capsys.readouterr()
    assert code == 2 and err.out == "" and err.err.strip().startswith("mmchaos: --check: ")
