"""Per-configuration numbers: requests, crashes and their rates, drift, errors, latency, throughput, cost.

Every function takes a loaded :class:`.results.CampaignResults` and returns a DataFrame with a ``config``
column (in the campaign's order). Intervals are 95 % unless ``confidence`` says otherwise.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mmchaos import schema as S
from mmchaos.schema import MALFORMED_KINDS, VALID_KINDS
from mmchaos.signatures import Signatures

from . import intervals as I
from .exposure import exposure as trial_uptime_exposure
from .open_loop import latency_from_schedule
from .results import CampaignResults

ALL_VALID = "all valid kinds"  # pooled row in latency / cost tables
QUANTILES = (0.5, 0.9, 0.95, 0.99)
KEY = ["config", "trial"]


def pooled_cost(cost: pd.DataFrame) -> pd.DataFrame:
    """Each configuration's cost over all valid kinds, by configuration."""
    return cost[cost["kind"] == ALL_VALID].set_index("config")


def _per_config(c: CampaignResults, df: pd.DataFrame) -> pd.DataFrame:
    """Reindex a config-indexed frame to every config in campaign order (configs with no rows get 0/NaN)."""
    return df.reindex(pd.CategoricalIndex(c.configs, categories=c.configs, name="config"))


def trial_exposure(c: CampaignResults) -> pd.DataFrame:
    """Per config: trials, requests sent, hours of load."""
    g = c.trials.groupby("config", observed=False)
    out = pd.DataFrame({"trials": g.size(), "requests": g["n_requests"].sum(), "hours": g["duration_s"].sum() / 3600.0})
    return _per_config(c, out)


def request_counts(c: CampaignResults) -> pd.DataFrame:
    """Requests by config × kind × outcome (one column per outcome), with the ok share."""
    r = c.requests
    t = r.groupby(["config", "kind", "outcome"], observed=True).size().unstack("outcome", fill_value=0)
    t = t.reindex(columns=list(S.OUTCOMES) + [o for o in t.columns if o not in S.OUTCOMES], fill_value=0)
    t.columns = t.columns.astype(str)
    t.insert(0, "n", t.sum(axis=1))
    t["ok_share"] = t.get(S.OK, 0) / t["n"]
    t = t.reset_index()
    t["kind"] = t["kind"].astype(str)
    order = {k: i for i, k in enumerate(S.KINDS)}
    t["_o"] = t["kind"].map(order).fillna(len(order))
    return t.sort_values(["config", "_o", "kind"]).drop(columns="_o").reset_index(drop=True)


def retry_success(c: CampaignResults) -> pd.DataFrame:
    """Per config: valid requests, the share that succeeded at the first attempt and after the client's retries
    (what an application sees), and the retries sent. Requests cut by the end of a run are left out."""
    r = c.requests
    v = r.loc[r["kind"].isin(VALID_KINDS) & (r["outcome"] != S.CUT), ["config", "outcome", "attempt", "final"]]
    attempt = v["attempt"].fillna(1)
    final = v["final"].fillna(True).astype(bool)
    ok = v["outcome"] == S.OK
    g = pd.DataFrame(
        {
            "config": v["config"],
            "first": attempt == 1,
            "first_ok": (attempt == 1) & ok,
            "final": final,
            "final_ok": final & ok,
            "retries": attempt > 1,
        }
    ).groupby("config", observed=False)
    out = _per_config(c, g[["first", "first_ok", "final", "final_ok", "retries"]].sum()).fillna(0).astype(int)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["first_ok_share"] = out["first_ok"] / out["first"].where(out["first"] > 0)
        out["final_ok_share"] = out["final_ok"] / out["final"].where(out["final"] > 0)
    return out.reset_index()


def crash_stats(c: CampaignResults, confidence: float = I.CONFIDENCE, exp: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per config: crashes, crash rate per 1,000 requests and per hour of load, and (what a crash-prone
    configuration under the restart policy needs: its refusals while it restarts are no exposure) per hour of
    uptime and per 1,000 answered requests (exact Poisson); share of trials that crashed at least once (Wilson).
    ``exp``: analysis.exposure.exposure(c), when computed already."""
    exp_t = trial_exposure(c)
    e = exp if exp is not None else trial_uptime_exposure(c)
    up = e.assign(config=e["config"].astype(str)).groupby("config")[["uptime_s", "answered"]].sum()
    up = up.reindex([str(x) for x in exp_t.index], fill_value=0)
    crashes = c.crashes.groupby("config", observed=False).size()
    crashed_trials = c.crashes.drop_duplicates(KEY).groupby("config", observed=False).size()
    out = exp_t.assign(
        crashes=crashes.reindex(exp_t.index, fill_value=0),
        trials_crashed=crashed_trials.reindex(exp_t.index, fill_value=0),
        uptime_hours=up["uptime_s"].to_numpy() / 3600.0,
        answered=up["answered"].to_numpy(),
    )
    for col, exposure, scale in (
        ("per_1k_requests", out["requests"], 1000.0),
        ("per_hour", out["hours"], 1.0),
        ("per_hour_up", out["uptime_hours"], 1.0),
        ("per_1k_answered", out["answered"], 1000.0),
    ):
        est, lo, hi = I.poisson_rate_ci(out["crashes"], exposure, scale, confidence)
        out[col], out[col + "_lo"], out[col + "_hi"] = est, lo, hi
    w = [I.wilson_ci(k, n, confidence) for k, n in zip(out["trials_crashed"], out["trials"])]
    out["share_crashed"], out["share_crashed_lo"], out["share_crashed_hi"] = map(list, zip(*w)) if w else ([], [], [])
    return out.reset_index()


def drift_stats(c: CampaignResults, confidence: float = I.CONFIDENCE) -> pd.DataFrame:
    """Per config: logged drift / cache-miss events (rate per 1,000 requests) and retryable 503 answers."""
    exp = trial_exposure(c)
    ev = drift_events(c)
    n_drift = ev.groupby("config", observed=False).size().reindex(exp.index, fill_value=0)
    r = c.requests
    n_503 = (
        r.loc[r["status"] == 503, ["config"]].groupby("config", observed=False).size().reindex(exp.index, fill_value=0)
    )
    out = exp[["requests"]].assign(drift_events=n_drift, responses_503=n_503)
    est, lo, hi = I.poisson_rate_ci(out["drift_events"], out["requests"], 1000.0, confidence)
    out["drift_per_1k"], out["drift_per_1k_lo"], out["drift_per_1k_hi"] = est, lo, hi
    w = [I.wilson_ci(k, n, confidence) for k, n in zip(out["responses_503"], out["requests"])]
    out["share_503"], out["share_503_lo"], out["share_503_hi"] = map(list, zip(*w)) if w else ([], [], [])
    return out.reset_index()


def drift_events(c: CampaignResults) -> pd.DataFrame:
    """Server-log lines whose signature means P0/P1 cache drift (the signature table's ``drift`` flag)."""
    le = c.log_events
    return le[le["signature"].astype(str).isin(Signatures.default().drift_names)]


def errors_by_status(c: CampaignResults) -> pd.DataFrame:
    """Requests that did not succeed, by config × HTTP status (or "none") × outcome."""
    r = c.requests
    bad = r.loc[r["outcome"] != S.OK, ["config", "status", "outcome"]]
    t = bad.assign(status=status_label(bad["status"])).groupby(["config", "status", "outcome"], observed=True).size()
    return t.rename("n").reset_index().sort_values(["config", "n"], ascending=[True, False], ignore_index=True)


def malformed_cases(c: CampaignResults) -> pd.DataFrame:
    """Malformed requests per case: how many attempts (those cut by the run's end aside, as the verdict counts
    them), how many got the expected status, what they got instead."""
    r = c.requests[c.requests["outcome"] != S.CUT]
    m = r.loc[r["kind"].isin(MALFORMED_KINDS), ["config", "kind", "case", "expected_status", "status", "outcome"]]
    if not len(m):
        return pd.DataFrame(columns=["config", "kind", "case", "expected_status", "attempts", "as_expected", "got"])
    m = m.assign(
        case=m["case"].astype(str).replace("nan", "(none)"),
        match=m["status"] == m["expected_status"],
        got=np.where(m["status"].notna(), status_label(m["status"]), m["outcome"].astype(str)),
    )
    g = m.groupby(["config", "kind", "case"], observed=True)
    out = pd.DataFrame(
        {
            "expected_status": g["expected_status"].agg(lambda s: _join_unique(s.dropna().astype(int))),
            "attempts": g.size(),
            "as_expected": g["match"].sum(),
        }
    )
    got = m.groupby(["config", "kind", "case", "got"], observed=True).size()
    out["got"] = got.groupby(level=[0, 1, 2], observed=True).apply(
        lambda s: ", ".join(f"{k[-1]} ×{v}" for k, v in s.sort_values(ascending=False).items())
    )
    return out.reset_index()


def crash_signatures(c: CampaignResults) -> pd.DataFrame:
    """Crashes by config × chain × reason, with the trials they hit. The chain names a crash by the log
    signatures that led to it, root first (mmchaos.signatures: Signatures.chain); a crash recorded before chains
    were (no chain column) is named by its signature alone."""
    cr = c.crashes
    if not len(cr):
        return pd.DataFrame(columns=["config", "chain", "reason", "crashes", "trials"])
    sig = cr["signature"].astype(object).where(cr["signature"].notna(), "(unclassified)").astype(str)
    chain = cr["chain"].astype(object) if "chain" in cr else pd.Series(None, index=cr.index, dtype=object)
    cr = cr.assign(
        chain=chain.where(chain.notna() & chain.astype(str).ne(""), sig).astype(str), reason=cr["reason"].astype(str)
    )
    g = cr.groupby(["config", "chain", "reason"], observed=True)
    return pd.DataFrame({"crashes": g.size(), "trials": g["trial"].agg(_join_unique)}).reset_index()


def log_signatures(c: CampaignResults) -> pd.DataFrame:
    """Classified server-log lines by config × signature (fatal or not), with one example line."""
    le = c.log_events
    if not len(le):
        return pd.DataFrame(columns=["config", "signature", "fatal", "lines", "example"])
    g = le.groupby(["config", "signature", "fatal"], observed=True)
    return pd.DataFrame({"lines": g.size(), "example": g["line"].first()}).reset_index()


def top_errors(c: CampaignResults, per_config: int = 8) -> pd.DataFrame:
    """The most frequent error texts per config (server text: escape before showing it)."""
    r = c.requests
    bad = r.loc[(r["outcome"] != S.OK) & r["error"].notna(), ["config", "error"]]
    t = bad.groupby(["config", "error"], observed=True).size().rename("n").reset_index()
    t = t.sort_values(["config", "n"], ascending=[True, False])
    return t.groupby("config", observed=True).head(per_config).reset_index(drop=True)


def status_label(status: pd.Series, missing: str = "none") -> np.ndarray:
    """HTTP status as text ("400"), ``missing`` where no status was received."""
    st = status.to_numpy(dtype=float, na_value=np.nan)
    ok = ~np.isnan(st)
    out = np.full(len(st), missing, dtype=object)
    out[ok] = st[ok].astype(np.int64).astype(str)
    return out


def _join_unique(s) -> str:
    return ", ".join(str(v) for v in sorted(set(s)))


# --- latency ------------------------------------------------------------------------------------------


def _ok_latency_groups(c: CampaignResults) -> dict[tuple[str, str], np.ndarray]:
    """Latencies (ms) of successful requests per (config, kind), plus the pooled valid kinds per config; an
    open-loop request's from when it was due (analysis.open_loop: coordinated omission stays visible)."""
    r = c.requests
    ok = r.loc[
        r["outcome"] == S.OK,
        ["config", "kind", "latency_ms", *(["sched_lag_ms"] if "sched_lag_ms" in r.columns else [])],
    ]
    ok = ok.assign(latency_ms=latency_from_schedule(ok))
    groups = {}
    for (cfg, kind), s in ok.groupby(["config", "kind"], observed=True)["latency_ms"]:
        groups[(str(cfg), str(kind))] = s.to_numpy()
    for cfg, s in ok.loc[ok["kind"].isin(VALID_KINDS)].groupby("config", observed=True)["latency_ms"]:
        groups[(str(cfg), ALL_VALID)] = s.to_numpy()
    return groups


def _kind_order(kind: str) -> int:
    return S.KINDS.index(kind) if kind in S.KINDS else (len(S.KINDS) + 1 if kind == ALL_VALID else len(S.KINDS))


def latency_table(c: CampaignResults, qs=QUANTILES, n_boot: int = I.BOOTSTRAP_RESAMPLES, _groups=None) -> pd.DataFrame:
    """p50/p90/p95/p99 latency (ms) of successful requests per config × kind, with bootstrap intervals."""
    groups = _groups if _groups is not None else _ok_latency_groups(c)
    rows = []
    for (cfg, kind), x in sorted(groups.items(), key=lambda kv: (c.configs.index(kv[0][0]), _kind_order(kv[0][1]))):
        est, lo, hi, _ = I.bootstrap_quantiles(x, qs, n_boot, seed=_seed(c, cfg, kind))
        row = {"config": cfg, "kind": kind, "n": len(x), "mean": float(np.mean(x))}
        for q, e, a, b in zip(qs, est, lo, hi):
            p = f"p{round(q * 100):d}"
            row[p], row[p + "_lo"], row[p + "_hi"] = e, a, b
        rows.append(row)
    cols = ["config", "kind", "n", "mean"] + [f"p{round(q * 100):d}{s}" for q in qs for s in ("", "_lo", "_hi")]
    return pd.DataFrame(rows, columns=cols)


def _seed(c: CampaignResults, cfg: str, kind: str) -> list[int]:
    # distinct, reproducible streams per group: two groups must never share their bootstrap draws
    return [I.SEED, c.configs.index(cfg), _kind_order(kind)]


def latency_quantile_grid(c: CampaignResults, points: int = 200) -> pd.DataFrame:
    """ECDF of successful latencies per config × kind, reduced to ``points`` quantiles (cheap to plot)."""
    grid = np.linspace(0, 1, points)
    rows = []
    for (cfg, kind), x in _ok_latency_groups(c).items():
        rows.append(pd.DataFrame({"config": cfg, "kind": kind, "latency_ms": np.quantile(x, grid), "p": grid}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["config", "kind", "latency_ms", "p"])


# --- throughput ---------------------------------------------------------------------------------------


def throughput_per_trial(c: CampaignResults) -> pd.DataFrame:
    """Per trial: requests sent and succeeded per second of load."""
    r = c.requests
    ok = r.loc[r["outcome"] == S.OK, KEY].groupby(KEY, observed=True).size().rename("ok")
    t = c.trials[KEY + ["duration_s", "n_requests", "status"]].join(ok, on=KEY)
    t["ok"] = t["ok"].fillna(0).astype(int)
    dur = t["duration_s"].where(t["duration_s"] > 0)
    t["ok_per_s"] = t["ok"] / dur
    t["sent_per_s"] = t["n_requests"] / dur
    return t


def throughput(c: CampaignResults, n_boot: int = I.BOOTSTRAP_RESAMPLES) -> pd.DataFrame:
    """Per config: ok requests per second (all load pooled) and the mean over trials with a bootstrap interval."""
    per = throughput_per_trial(c)
    rows = []
    for i, cfg in enumerate(c.configs):
        t = per[per["config"] == cfg]
        draws = I.bootstrap_mean(t["ok_per_s"], n_boot, seed=[I.SEED, i, 99])
        lo, hi = I.percentile_interval(draws)
        dur = t["duration_s"].sum()
        rows.append(
            {
                "config": cfg,
                "trials": len(t),
                "ok": int(t["ok"].sum()),
                "seconds": dur,
                "ok_per_s": t["ok"].sum() / dur if dur > 0 else np.nan,
                "sent_per_s": t["n_requests"].sum() / dur if dur > 0 else np.nan,
                "trial_mean_ok_per_s": t["ok_per_s"].mean(),
                "trial_mean_lo": lo,
                "trial_mean_hi": hi,
            }
        )
    return pd.DataFrame(rows)


def pick_bin(c: CampaignResults, target_bins: int = 60) -> float:
    """A round bin width (s) giving about ``target_bins`` bins over the longest trial."""
    return round_bin(float(np.nanmax(c.trials["duration_s"].to_numpy())) if len(c.trials) else 60.0, target_bins)


def round_bin(span_s: float, target_bins: int = 60) -> float:
    """A round bin width (s) giving about ``target_bins`` bins over ``span_s`` seconds."""
    for w in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600):
        if span_s / w <= target_bins:
            return float(w)
    return 3600.0


def throughput_over_time(c: CampaignResults, bin_s: float | None = None) -> pd.DataFrame:
    """Ok requests per second in time bins since trial start, averaged over the trials still running."""
    bin_s = bin_s or pick_bin(c)
    r = c.requests
    ok = r.loc[r["outcome"] == S.OK, KEY + ["t_rel"]]
    b = (ok["t_rel"] // bin_s).astype(int)
    counts = ok.assign(bin=b).groupby(KEY + ["bin"], observed=True).size().rename("ok").reset_index()
    # denominator: trials whose load covered the bin (a trial that ended early must not pull the mean down)
    out = []
    for cfg in c.configs:
        tr = c.trials[c.trials["config"] == cfg]
        if not len(tr):
            continue
        nb = int(np.ceil(np.nanmax(tr["duration_s"]) / bin_s)) if tr["duration_s"].notna().any() else 0
        bins = np.arange(nb)
        active = (tr["duration_s"].to_numpy()[None, :] > bins[:, None] * bin_s).sum(axis=1)
        tot = counts[counts["config"] == cfg].groupby("bin")["ok"].sum().reindex(bins, fill_value=0)
        out.append(
            pd.DataFrame(
                {
                    "config": cfg,
                    "t": bins * bin_s,
                    "ok_per_s": tot.to_numpy() / np.maximum(active, 1) / bin_s,
                    "trials": active,
                }
            )
        )
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["config", "t", "ok_per_s", "trials"])


# --- workaround cost ----------------------------------------------------------------------------------


def default_baseline(c: CampaignResults) -> str:
    """The server as shipped (no extra flags) that did not crash: a workaround's cost is measured against a
    server that keeps serving. Else the first without extra flags, else the first."""
    flags = c.trials.groupby("config", observed=True)["flags"].agg(lambda s: set(s))
    crashed = set(c.crashes["config"].astype(str))
    shipped = [cfg for cfg in c.configs if cfg in flags.index and flags[cfg] == {""}]
    for cfg in shipped:
        if cfg not in crashed:
            return cfg
    return shipped[0] if shipped else c.configs[0]


def workaround_cost(
    c: CampaignResults, baseline: str, n_boot: int = I.BOOTSTRAP_RESAMPLES, _groups=None
) -> pd.DataFrame:
    """Each config's p50/p95 latency and throughput relative to ``baseline`` (ratio; 1.0 = same cost).

    Latency ratios: independent bootstraps over requests of the two configs. Throughput ratio: bootstrap
    over trials of the mean per-trial ok/s. Rows per valid kind plus the pooled valid kinds.
    """
    groups = _groups if _groups is not None else _ok_latency_groups(c)
    per = throughput_per_trial(c)
    base_tp = I.bootstrap_mean(per.loc[per["config"] == baseline, "ok_per_s"], n_boot, seed=[I.SEED, 1001])
    rows = []
    for cfg in c.configs:
        tp = I.bootstrap_mean(
            per.loc[per["config"] == cfg, "ok_per_s"], n_boot, seed=[I.SEED, 1002, c.configs.index(cfg)]
        )
        with np.errstate(divide="ignore", invalid="ignore"):  # a baseline with no success gives inf/NaN: shown as such
            tp_ratio = tp / base_tp if cfg != baseline else np.ones(n_boot)
            tp_est = (
                per.loc[per["config"] == cfg, "ok_per_s"].mean() / per.loc[per["config"] == baseline, "ok_per_s"].mean()
            )
        for kind in [*VALID_KINDS, ALL_VALID]:
            if (cfg, kind) not in groups or (baseline, kind) not in groups:
                continue
            est_c, _, _, d_c = I.bootstrap_quantiles(groups[(cfg, kind)], (0.5, 0.95), n_boot, seed=_seed(c, cfg, kind))
            est_b, _, _, d_b = I.bootstrap_quantiles(
                groups[(baseline, kind)], (0.5, 0.95), n_boot, seed=_seed(c, baseline, kind)
            )
            row: dict[str, object] = {"config": cfg, "kind": kind, "baseline": baseline}
            for i, p in enumerate(("p50", "p95")):
                row[p + "_ms"] = est_c[i]
                row[p + "_ratio"] = est_c[i] / est_b[i]
                if cfg == baseline:
                    row[p + "_ratio_lo"] = row[p + "_ratio_hi"] = 1.0
                else:
                    row[p + "_ratio_lo"], row[p + "_ratio_hi"] = I.percentile_interval(d_c[i] / d_b[i])
            row["throughput_ratio"] = tp_est
            row["throughput_ratio_lo"], row["throughput_ratio_hi"] = (
                (1.0, 1.0) if cfg == baseline else I.percentile_interval(tp_ratio)
            )
            rows.append(row)
    cols = ["config", "kind", "baseline"] + [
        f"{p}{s}" for p in ("p50", "p95") for s in ("_ms", "_ratio", "_ratio_lo", "_ratio_hi")
    ]
    return pd.DataFrame(rows, columns=cols + ["throughput_ratio", "throughput_ratio_lo", "throughput_ratio_hi"])
