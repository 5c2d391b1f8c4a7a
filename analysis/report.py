"""The campaign report: ``report.md`` (+ PNG plots beside it) and one self-contained ``report.html``.

    python -m analysis.report RESULTS_DIR [--baseline CONFIG] [--compare OTHER_DIR] [--out DIR]

RESULTS_DIR is one campaign folder (``results/<campaign>``). Everything is computed in memory first and the
files are written last, each to a temporary name and renamed, so a failure never leaves half a report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from analysis import stats
from analysis.attribution import DEFAULT_WINDOW_S, SAME_IMAGE, attribute
from analysis.document import Doc
from analysis.load import Campaign, LoadError, combine, find_trials, load_campaign, read_server_log
from analysis.survival import first_crash_durations, kaplan_meier, median_survival
from analysis.verdict import CHECK_TITLES, MIN_OK_SHARE, verdicts

REPORT_MD = "report.md"
REPORT_HTML = "report.html"
DEFAULT_OUT = "report"  # inside the campaign folder
MAX_EVENT_ROWS = 60
LOG_TAIL_LINES = 25


class ReportError(ValueError):
    """Bad input: said in one line by the CLI."""


@dataclass
class ReportResult:
    out_dir: Path
    files: list[Path]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def html(self) -> Path:
        return self.out_dir / REPORT_HTML

    @property
    def markdown(self) -> Path:
        return self.out_dir / REPORT_MD


def write_report(
    campaign_dir: str | Path,
    out_dir: str | Path | None = None,
    baseline: str | None = None,
    compare_with: str | Path | None = None,
    window_s: float = DEFAULT_WINDOW_S,
    min_ok_share: float = MIN_OK_SHARE,
    progress: Callable[[str], None] | None = None,
) -> ReportResult:
    """Load ``campaign_dir`` (and ``compare_with``), compute everything, write the report; return the paths.

    ``baseline`` names the configuration the workaround cost is measured against (default: the one
    without extra flags). With ``compare_with``, configurations are named ``<campaign>/<config>`` and a
    side-by-side section pairs the configurations the two campaigns share.
    """
    say = progress or (lambda _msg: None)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        timings[name] = now - t0
        t0 = now

    _precheck(campaign_dir, compare_with, baseline)  # bad input fails here, before any progress line
    say(f"loading {campaign_dir}")
    try:
        main_c = load_campaign(campaign_dir)
        c = main_c
        if compare_with is not None:
            say(f"loading {compare_with}")
            c = combine([main_c, load_campaign(compare_with)])
    except LoadError as e:
        raise ReportError(str(e)) from e
    lap("load")
    base = _resolve_baseline(c, baseline, compared=compare_with is not None)
    say(f"computing statistics for {len(c.configs)} configuration(s), {len(c.requests):,} requests")
    doc = build(c, base, window_s, min_ok_share, compared=compare_with is not None, timings=timings, lap=lap,
                say=say)
    markdown, html_text = doc.to_markdown(), doc.to_html()
    lap("render")
    out = Path(out_dir) if out_dir is not None else Path(campaign_dir) / DEFAULT_OUT
    files = _write_all(out, {REPORT_MD: markdown.encode(), REPORT_HTML: html_text.encode(), **doc.images()})
    lap("write")
    say(f"wrote {out / REPORT_HTML}")
    return ReportResult(out, files, timings)


def _precheck(campaign_dir, compare_with, baseline: str | None) -> None:
    """Cheap checks on the folders alone: they exist, hold trials, and the baseline names one of their configs."""
    configs = []
    for d in [campaign_dir] + ([compare_with] if compare_with is not None else []):
        d = Path(d)
        if not d.is_dir():
            raise ReportError(f"{d} is not a folder (expected results/<campaign>)")
        found = find_trials(d)
        if not found:
            try:
                load_campaign(d)  # says why, with a hint
            except LoadError as e:
                raise ReportError(str(e)) from e
        configs += [cfg for cfg, _, _ in found] + [f"{d.resolve().name}/{cfg}" for cfg, _, _ in found]
    if baseline is not None and baseline not in configs:
        have = sorted({cfg for cfg, _, _ in find_trials(Path(campaign_dir))})
        raise ReportError(f"baseline {baseline!r} is not a configuration of this campaign (have: {', '.join(have)})")


def _resolve_baseline(c: Campaign, baseline: str | None, compared: bool) -> str:
    if baseline is None:
        return stats.default_baseline(c)
    if baseline in c.configs:
        return baseline
    if compared:  # an unprefixed name: that config of the main campaign, else of the other one
        for cfg in c.configs:
            if cfg.split("/", 1)[1] == baseline:
                return cfg
    raise ReportError(f"baseline {baseline!r} is not a configuration of this campaign (have: {', '.join(c.configs)})")


def _write_all(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Write every file under a temporary name first, then rename them all: no half-written report."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create {out}: {e.strerror or e}") from e
    tmps = []
    try:
        for name, data in files.items():
            tmp = out / f".{name}.tmp-{os.getpid()}"
            tmp.write_bytes(data)
            tmps.append((tmp, out / name))
        for tmp, final in tmps:
            os.replace(tmp, final)
    except OSError as e:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        raise ReportError(f"cannot write the report into {out}: {e.strerror or e}") from e
    return [final for _, final in tmps]


# --- formatting ---------------------------------------------------------------------------------------


def num(x, unit: str = "") -> str:
    """Three significant digits, thousands separators, "—" for missing."""
    if x is None or (isinstance(x, float) and not np.isfinite(x)) or pd.isna(x):
        return "—"
    x = float(x)
    if x == 0:
        return "0" + unit
    x = round(x, 2 - int(np.floor(np.log10(abs(x)))))  # round first, so 0.99998 becomes 1.00, not 1.000
    digits = max(0, 2 - int(np.floor(np.log10(abs(x)))))
    return f"{x:,.{digits}f}{unit}"


def ci(est, lo, hi, unit: str = "") -> str:
    if est is None or pd.isna(est):
        return "—"
    return f"{num(est)}{unit} [{num(lo)}, {num(hi)}]"


def pct(x) -> str:
    if x is None or pd.isna(x):
        return "—"
    return f"{num(100 * x)} %" if 0 < abs(x) < 0.01 else f"{100 * x:.1f} %"  # 0.04 %, not 0.0 %


def pct_ci(est, lo, hi) -> str:
    return "—" if pd.isna(est) else f"{100 * est:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def ci_col(df: pd.DataFrame, col: str, unit: str = "", fmt=None) -> list[str]:
    """``col`` with its ``col_lo``/``col_hi`` interval, formatted, for each row."""
    fmt = fmt or (lambda e, lo, hi: ci(e, lo, hi, unit))
    return [fmt(*x) for x in df[[col, col + "_lo", col + "_hi"]].to_numpy()]


def integer(x) -> str:
    return "—" if x is None or pd.isna(x) else f"{int(x):,}"


def _by_config(df: pd.DataFrame) -> dict[str, pd.Series]:
    return {str(r["config"]): r for _, r in df.iterrows()}


# --- the document -------------------------------------------------------------------------------------


def build(c: Campaign, baseline: str, window_s: float = DEFAULT_WINDOW_S, min_ok_share: float = MIN_OK_SHARE,
          compared: bool = False, timings=None, lap=lambda _n: None, say=lambda _m: None) -> Doc:
    """Compute every table and figure and lay them out."""
    from analysis import plots  # matplotlib is slow to import: only when a report is really built
    crash = stats.crash_stats(c)
    drift = stats.drift_stats(c)
    counts = stats.request_counts(c)
    groups = stats._ok_latency_groups(c)
    lat = stats.latency_table(c, _groups=groups)
    tput = stats.throughput(c)
    cost = stats.workaround_cost(c, baseline, _groups=groups)
    verdict = verdicts(c, min_ok_share)
    durations = first_crash_durations(c.trials, c.requests, c.crashes)
    curves = {cfg: {w: kaplan_meier(d[w], d["crashed"]) for w in ("time_s", "requests")}
              for cfg, d in durations.groupby("config", observed=True)}
    events, attribution = attribute(c, window_s)
    lap("stats")

    say("drawing plots")
    figs = {
        "crash_rates": plots.crash_rates(crash, c.configs),
        "survival": plots.survival(curves, durations, c.configs),
        "latency": plots.latency_ecdf(stats.latency_quantile_grid(c), c.configs),
        "throughput": plots.throughput_over_time(stats.throughput_over_time(c), c.configs),
    }
    timeline_figs = {cfg: plots.timelines(c, cfg) for cfg in c.configs}
    lap("plots")

    doc = Doc(f"mmchaos report — {c.name}")
    _intro(doc, c, baseline, window_s, compared)
    _summary(doc, c, verdict, crash, drift, counts, lat, tput, cost, attribution, baseline)
    _verdicts(doc, verdict, min_ok_share)
    _what_was_run(doc, c)
    if compared:
        _side_by_side(doc, c, verdict, crash, lat, tput)
    _crashes(doc, c, crash, figs["crash_rates"])
    _survival(doc, durations, curves, figs["survival"], c.configs)
    _attribution(doc, events, attribution, window_s)
    _drift(doc, drift)
    _errors(doc, c)
    _latency(doc, lat, figs["latency"])
    _throughput(doc, tput, figs["throughput"])
    _cost(doc, cost, baseline)
    _timelines(doc, timeline_figs)
    _trials(doc, c, durations)
    return doc


def _intro(doc: Doc, c: Campaign, baseline: str, window_s: float, compared: bool) -> None:
    tr = c.trials
    span = [pd.to_datetime(x, unit="s", utc=True) for x in (tr["t_start"].min(), tr["t_end"].max())]
    doc.p(
        f"Generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC from {c.path}"
        + (" (compared with a second campaign; configurations are named campaign/config)" if compared else "")
        + f". {len(c.configs)} configuration(s), {len(tr)} trial(s), {len(c.requests):,} requests, "
        f"{tr['duration_s'].sum() / 3600:.2f} hours of load"
        + (f", run between {span[0]:%Y-%m-%d %H:%M} and {span[1]:%Y-%m-%d %H:%M} UTC." if pd.notna(span[0]) else ".")
    )
    doc.p(
        "What this measures: a vLLM server serving a multimodal embedding model is driven with a realistic mix of "
        "requests plus malformed ones that can leave the multi-modal processor cache of the API server (P0) and the "
        "engine core (P1) out of step. A later request with the same image then misses in P1 (cache drift); "
        "depending on the version this kills the server or returns a retryable 503. Each configuration (vLLM "
        "version × flags) was run for several trials; this report counts crashes, drift, errors, latency and "
        "throughput per configuration, says which requests preceded each incident, and whether the configuration "
        "passes the bug report's verification step."
    )
    doc.note(
        "Intervals are 95 %: exact Poisson (Garwood) for rates, Wilson for shares of trials, bootstrap for latency "
        "percentiles and cost ratios, Kaplan–Meier (log-log Greenwood) for survival. "
        f"Cost is relative to the baseline configuration {baseline!r}. Attribution window: {window_s:g} s."
    )
    if c.warnings:
        doc.p("Notes from loading the results:")
        doc.bullets(c.warnings)


def _summary(doc, c, verdict, crash, drift, counts, lat, tput, cost, attribution, baseline) -> None:
    doc.h(2, "Summary")
    v, cr, dr, tp = _by_config(verdict), _by_config(crash), _by_config(drift), _by_config(tput)
    pooled = lat[lat["kind"] == stats.ALL_VALID].set_index("config")
    cst = cost[cost["kind"] == stats.ALL_VALID].set_index("config")
    valid = counts[counts["kind"].isin(stats.VALID_KINDS)].groupby("config", observed=True)[["n", "ok"]].sum()
    rows = []
    for cfg in c.configs:
        trials = c.trials[c.trials["config"] == cfg]
        status = ", ".join(f"{k} {n}" for k, n in trials["status"].value_counts().items())
        rows.append({
            "configuration": cfg,
            "workaround verified": v[cfg]["verdict"],
            "trials": f"{len(trials)} ({status})",
            "requests": integer(trials["n_requests"].sum()),
            "valid ok": pct(valid.loc[cfg, "ok"] / valid.loc[cfg, "n"]) if cfg in valid.index else "—",
            "crashes": integer(cr[cfg]["crashes"]),
            "crashes / hour": ci(cr[cfg]["per_hour"], cr[cfg]["per_hour_lo"], cr[cfg]["per_hour_hi"]),
            "trials crashed": pct_ci(*cr[cfg][["share_crashed", "share_crashed_lo", "share_crashed_hi"]]),
            "drift lines": integer(dr[cfg]["drift_events"]),
            "503 share": pct(dr[cfg]["share_503"]),
            "p50 / p95 ms (valid)": (f"{num(pooled.loc[cfg, 'p50'])} / {num(pooled.loc[cfg, 'p95'])}"
                                     if cfg in pooled.index else "—"),
            "ok / s": num(tp[cfg]["ok_per_s"]),
            f"p50 vs {baseline}": (num(cst.loc[cfg, "p50_ratio"], "×") if cfg in cst.index else "—"),
        })
    doc.table(pd.DataFrame(rows))
    doc.p("In plain words:")
    doc.bullets([_finding(cfg, v[cfg], cr[cfg], dr[cfg], attribution, cst, baseline) for cfg in c.configs])


def _finding(cfg, v, cr, dr, attribution, cst, baseline) -> str:
    failed = [t for k, t in CHECK_TITLES.items() if not v[k]]
    parts = [f"{cfg}: " + ("workaround verified" if v["verdict"] == "yes" else
                           "NOT verified (failed: " + ", ".join(failed) + ")")]
    if cr["crashes"]:
        parts.append(f"{int(cr['crashes'])} crash(es) in {int(cr['trials'])} trial(s), "
                     f"{num(cr['per_hour'])} per hour [{num(cr['per_hour_lo'])}, {num(cr['per_hour_hi'])}]")
    else:
        parts.append(f"no crash in {int(cr['trials'])} trial(s) (at most {num(cr['per_hour_hi'])} per hour at 95 %)")
    if dr["drift_events"]:
        parts.append(f"{int(dr['drift_events'])} cache-drift line(s)")
    a = attribution[(attribution["config"] == cfg)] if len(attribution) else attribution
    for event in ("crash", "drift"):
        top = a[(a["event"] == event) & (a["share_of_events"] >= 0.5) & (a["lift"] > 1.5)] if len(a) else a
        if len(top):
            t = top.iloc[0]
            what = t["kind"] + ("" if t["case"] == "—" else f"/{t['case']}")
            how = "with the same image" if t["match"] == SAME_IMAGE else "(any image)"
            parts.append(f"{'crashes' if event == 'crash' else 'drift lines'} were preceded {how} by {what} in "
                         f"{t['share_of_events']:.0%} of cases vs {t['background_share']:.0%} of random windows")
    if cfg in cst.index and cfg != baseline:
        r = cst.loc[cfg]
        parts.append(f"latency p50 {num(r['p50_ratio'])}× and throughput {num(r['throughput_ratio'])}× {baseline}'s")
    return "; ".join(parts) + "."


def _verdicts(doc: Doc, verdict: pd.DataFrame, min_ok_share: float) -> None:
    doc.h(2, "Verdict per configuration")
    doc.p(
        "The bug report's verification step: send the poison request (expect 400), then the same image in a valid "
        "request; the bad request must fail alone, the server must not log the cache drift or die, /health must stay "
        f"200, and normal requests must keep succeeding (here: at least {min_ok_share:.0%} of valid requests sent "
        "after the first malformed_post request). A check that could not be made counts as failed."
    )
    for _, row in verdict.iterrows():
        doc.h(3, f"{row['config']}: {row['verdict']}")
        doc.bullets(row["evidence"])


def _distinct(values) -> str:
    return ", ".join(sorted({str(x) for x in values if x is not None and not pd.isna(x)})) or "—"


def _what_was_run(doc: Doc, c: Campaign) -> None:
    doc.h(2, "What was run")
    rows = []
    for cfg in c.configs:
        t = c.trials[c.trials["config"] == cfg]
        first = t.iloc[0] if len(t) else None
        wl = json.loads(first["workload"]) if first is not None else {}
        rows.append({
            "configuration": cfg,
            "vLLM": _distinct(t["engine"]),
            "target": _distinct(t["target"]),
            "flags": ", ".join(sorted(set(t["flags"]))) or "(none)",
            "env": _distinct(t["env"]),
            "users": wl.get("users", "—"),
            "shape": wl.get("shape", "—"),
            "duration / trial": num(t["duration_s"].mean(), " s"),
            "max requests": wl.get("max_requests") if wl.get("max_requests") is not None else "—",
            "trials": len(t),
            "git": _distinct(t["git_rev"]),
        })
    doc.table(pd.DataFrame(rows))
    machines = sorted({str(m) for m in c.trials["machine"].dropna()})
    if machines:
        doc.p("Machine: " + "; ".join(machines))
    mix = {json.dumps(json.loads(w).get("mix"), sort_keys=True) for w in c.trials["workload"]}
    if len(mix) == 1 and next(iter(mix)) != "null":
        doc.p("Request mix (weights): " + ", ".join(f"{k} {v}" for k, v in json.loads(next(iter(mix))).items()))


def _side_by_side(doc, c, verdict, crash, lat, tput) -> None:
    doc.h(2, "Side by side: the two campaigns")
    camps = list(dict.fromkeys(cfg.split("/", 1)[0] for cfg in c.configs))
    names = {}
    for cfg in c.configs:
        camp, name = cfg.split("/", 1)
        names.setdefault(name, {})[camp] = cfg
    common = [n for n, d in names.items() if len(d) == len(camps)]
    if not common:
        doc.p("The two campaigns share no configuration name; compare them in the summary table above.")
        return
    v, cr, tp = _by_config(verdict), _by_config(crash), _by_config(tput)
    pooled = lat[lat["kind"] == stats.ALL_VALID].set_index("config")
    rows = []
    for n in common:
        for label, f in (
            ("workaround verified", lambda k: v[k]["verdict"]),
            ("crashes / hour", lambda k: ci(cr[k]["per_hour"], cr[k]["per_hour_lo"], cr[k]["per_hour_hi"])),
            ("crashes / 1,000 requests", lambda k: ci(cr[k]["per_1k_requests"], cr[k]["per_1k_requests_lo"],
                                                      cr[k]["per_1k_requests_hi"])),
            ("p50 ms (valid)", lambda k: ci(*pooled.loc[k, ["p50", "p50_lo", "p50_hi"]]) if k in pooled.index
             else "—"),
            ("p95 ms (valid)", lambda k: ci(*pooled.loc[k, ["p95", "p95_lo", "p95_hi"]]) if k in pooled.index
             else "—"),
            ("ok / s", lambda k: num(tp[k]["ok_per_s"])),
        ):
            rows.append({"configuration": n, "measure": label, **{camp: f(names[n][camp]) for camp in camps}})
    doc.table(pd.DataFrame(rows))


def _crashes(doc: Doc, c: Campaign, crash: pd.DataFrame, fig: bytes) -> None:
    doc.h(2, "Crashes")
    doc.p("A crash is a server death detected by the harness (process exit, failed health checks or a hang). "
          "Rates count every crash (a trial can restart the server and crash again); the share of trials counts "
          "trials with at least one crash. Requests include every request sent, also those refused while down.")
    doc.table(pd.DataFrame({
        "configuration": crash["config"].astype(str),
        "trials": crash["trials"].map(integer),
        "hours": crash["hours"].map(num),
        "requests": crash["requests"].map(integer),
        "crashes": crash["crashes"].map(integer),
        "per 1,000 requests": ci_col(crash, "per_1k_requests"),
        "per hour": ci_col(crash, "per_hour"),
        "trials crashed": [f"{int(k)}/{int(n)}" for k, n in crash[["trials_crashed", "trials"]].to_numpy()],
        "share of trials crashed": ci_col(crash, "share_crashed", fmt=pct_ci),
    }), caption="Crash rates with 95 % intervals")
    doc.image("crash_rates.png", fig, "crash rates per configuration with intervals")
    sig = stats.crash_signatures(c)
    if len(sig):
        doc.table(sig.rename(columns={"config": "configuration", "trials": "in trials"}),
                  caption="Crashes by signature and how they were detected")
    logs = stats.log_signatures(c)
    if len(logs):
        logs = logs.assign(example=logs["example"].astype(str).str.slice(0, 240),
                           fatal=logs["fatal"].map({True: "fatal", False: "warning"}))
        doc.table(logs.rename(columns={"config": "configuration"}), caption="Classified server-log lines")


def _survival(doc, durations, curves, fig, configs) -> None:
    doc.h(2, "Time and requests to the first crash")
    doc.p("Kaplan–Meier estimate of the share of trials still without a crash. Trials that ended without "
          "crashing are censored at their end (marked |): they say 'at least this long', not 'crashed here'.")
    doc.image("survival.png", fig, "Kaplan-Meier survival curves until first crash")
    rows = []
    for cfg in configs:
        if cfg not in curves:
            continue
        d = durations[durations["config"] == cfg]
        mt, mr = median_survival(curves[cfg]["time_s"]), median_survival(curves[cfg]["requests"])
        rows.append({
            "configuration": cfg, "trials": len(d), "crashed": int(d["crashed"].sum()),
            "median time to first crash": num(mt / 60, " min") if np.isfinite(mt) else
            f"not reached (over {num(d['time_s'].max() / 60)} min)",
            "median requests to first crash": integer(mr) if np.isfinite(mr) else
            f"not reached (over {integer(d['requests'].max())})",
            "first crashes at (min)": ", ".join(num(x / 60) for x in sorted(d.loc[d["crashed"], "time_s"])) or "—",
        })
    doc.table(pd.DataFrame(rows))


def _attribution(doc, events, summary, window_s) -> None:
    doc.h(2, "What was sent before each incident")
    doc.p(
        f"For every cache-drift line and every crash, the requests with images sent in the {window_s:g} s before it "
        "(for crashes: before the last healthy moment, up to detection). When the drift line names an mm_hash that "
        "matches a sent image, only requests with that same image count ('same image'); otherwise all image "
        "requests in the window do. 'background' is the same share for windows placed before random image "
        "requests of the configuration; lift = share of incidents / background. A kind with a high share and a "
        "lift well above 1 is what the incidents have in common — the likely trigger."
    )
    if not len(events):
        doc.p("No drift line and no crash was recorded: nothing to attribute.")
        return
    s = summary[(summary["share_of_events"] >= 0.2) | (summary["lift"] > 1.5)] if len(summary) else summary
    if len(s):
        doc.table(pd.DataFrame({
            "configuration": s["config"].astype(str), "incident": s["event"], "matched by": s["match"],
            "kind": s["kind"], "malformed case": s["case"],
            "incidents preceded": [f"{int(a)}/{int(b)}" for a, b in s[["events_with", "events"]].to_numpy()],
            "share": s["share_of_events"].map(pct), "background": s["background_share"].map(pct),
            "lift": s["lift"].map(lambda x: "∞" if np.isinf(x) else num(x)),
        }), caption="Kinds and malformed cases seen before incidents (shown: share at least 20 % or lift above 1.5)")
    shown = events.head(MAX_EVENT_ROWS)
    doc.table(pd.DataFrame({
        "configuration": shown["config"].astype(str), "trial": shown["trial"], "incident": shown["event"],
        "signature": shown["signature"], "at (min)": (shown["t_rel"] / 60).map(num),
        "mm_hash": shown["mm_hash"].fillna("—"), "matched by": shown["match"], "requests": shown["requests"],
        "sent before": shown["sent"].fillna("—").astype(str).str.slice(0, 300),
        "last one": shown["last_sent"].fillna("—"), "last one, s before": shown["last_before_s"].map(num),
    }), caption=f"Incidents ({len(shown)} of {len(events)} shown)")


def _drift(doc, drift) -> None:
    doc.h(2, "Cache drift and retryable 503s")
    doc.p("Drift lines: server-log lines classified as P0/P1 cache drift or cache miss (a signature whose name "
          "mentions drift, cache miss or a missing cached item). 503 share: requests answered with HTTP 503 — "
          "in versions that turn the miss into a retryable error, this is what clients see instead of a crash.")
    doc.table(pd.DataFrame({
        "configuration": drift["config"].astype(str), "requests": drift["requests"].map(integer),
        "drift lines": drift["drift_events"].map(integer),
        "drift per 1,000 requests": ci_col(drift, "drift_per_1k"),
        "503 answers": drift["responses_503"].map(integer),
        "503 share": ci_col(drift, "share_503", fmt=pct_ci),
    }))


def _errors(doc, c) -> None:
    doc.h(2, "Errors")
    counts = stats.request_counts(c)
    outcome_cols = [col for col in counts.columns if col not in ("config", "kind", "n", "ok_share")]
    doc.table(counts.assign(config=counts["config"].astype(str), ok_share=counts["ok_share"].map(pct),
                            n=counts["n"].map(integer), **{o: counts[o].map(integer) for o in outcome_cols})
              .rename(columns={"config": "configuration", "ok_share": "ok share"}),
              caption="Requests by kind and outcome")
    st = stats.errors_by_status(c)
    if len(st):
        doc.table(st.assign(config=st["config"].astype(str), n=st["n"].map(integer))
                  .rename(columns={"config": "configuration", "status": "HTTP status"}),
                  caption="Requests that did not succeed, by HTTP status ('none': no answer)")
    mc = stats.malformed_cases(c)
    if len(mc):
        doc.table(mc.assign(config=mc["config"].astype(str))
                  .rename(columns={"config": "configuration", "expected_status": "expected",
                                   "as_expected": "as expected"}),
                  caption="Malformed requests per case: expected status versus what came back")
    te = stats.top_errors(c)
    if len(te):
        doc.table(te.assign(config=te["config"].astype(str), error=te["error"].astype(str).str.slice(0, 300),
                            n=te["n"].map(integer)).rename(columns={"config": "configuration", "error": "error text"}),
                  caption="Most frequent error texts (as received)")


def _latency(doc, lat, fig) -> None:
    doc.h(2, "Latency")
    doc.p("Latency of successful requests only (a failed request's latency says little). Percentiles use linear "
          "interpolation; brackets are 95 % bootstrap intervals.")
    doc.image("latency.png", fig, "latency ECDF per kind and configuration")
    if len(lat):
        doc.table(pd.DataFrame({
            "configuration": lat["config"], "kind": lat["kind"], "n": lat["n"].map(integer),
            **{f"p{p} ms": ci_col(lat, f"p{p}") for p in (50, 90, 95, 99)},
        }), caption="Latency percentiles (ms) of successful requests")


def _throughput(doc, tput, fig) -> None:
    doc.h(2, "Throughput")
    doc.p("Successful requests per second of load (load time includes time the server was down). "
          "'mean over trials' has a bootstrap interval over trials.")
    doc.table(pd.DataFrame({
        "configuration": tput["config"], "trials": tput["trials"], "ok requests": tput["ok"].map(integer),
        "sent / s": tput["sent_per_s"].map(num), "ok / s (pooled)": tput["ok_per_s"].map(num),
        "ok / s (mean over trials)": ci_col(tput.rename(columns={"trial_mean_ok_per_s": "m", "trial_mean_lo": "m_lo",
                                                                  "trial_mean_hi": "m_hi"}), "m"),
    }))
    doc.image("throughput.png", fig, "throughput over time per configuration")


def _cost(doc, cost, baseline) -> None:
    doc.h(2, "Cost of the workaround")
    doc.p(f"Each configuration relative to the baseline {baseline!r}: ratio of p50 and p95 latency of successful "
          "requests (bootstrap over requests) and of throughput (bootstrap over trials). 1.00× is the same; "
          "above 1 means slower (latency) or more (throughput).")
    if not len(cost):
        doc.p("Not enough successful requests to compare.")
        return
    doc.table(pd.DataFrame({
        "configuration": cost["config"], "kind": cost["kind"],
        "p50 ms": cost["p50_ms"].map(num),
        "p50 ratio": [ci(*x, unit="×") for x in cost[["p50_ratio", "p50_ratio_lo", "p50_ratio_hi"]].to_numpy()],
        "p95 ms": cost["p95_ms"].map(num),
        "p95 ratio": [ci(*x, unit="×") for x in cost[["p95_ratio", "p95_ratio_lo", "p95_ratio_hi"]].to_numpy()],
        "throughput ratio": [ci(*x, unit="×") for x in
                             cost[["throughput_ratio", "throughput_ratio_lo", "throughput_ratio_hi"]].to_numpy()],
    }))


def _timelines(doc, timeline_figs) -> None:
    doc.h(2, "Timelines")
    doc.p("Per trial: successful requests per second (green), unexpected failures per second (red; malformed "
          "requests answered as expected and deliberate aborts are not counted), crashes (dashed), failed /health "
          "polls (black ticks), logged cache drift (orange triangles) and requests running on the server from "
          "/metrics (blue, right axis).")
    for i, (cfg, (png, hidden)) in enumerate(timeline_figs.items()):
        doc.h(3, cfg)
        doc.image(f"timeline_{i:02d}.png", png, f"timeline of the trials of {cfg}")
        if hidden:
            doc.note(f"Not drawn: trials {', '.join(map(str, hidden))}.")


def _trials(doc, c, durations) -> None:
    doc.h(2, "Trials")
    r = c.requests
    ok = r.loc[r["outcome"] == "ok", ["config", "trial"]].groupby(["config", "trial"], observed=True).size()
    ncrash = c.crashes.groupby(["config", "trial"], observed=True).size()
    ndrift = stats.drift_events(c).groupby(["config", "trial"], observed=True).size()
    t = c.trials
    key = pd.MultiIndex.from_arrays([t["config"], t["trial"]])
    doc.table(pd.DataFrame({
        "configuration": t["config"].astype(str), "trial": t["trial"], "folder": t["trial_dir"], "status": t["status"],
        "started (UTC)": pd.to_datetime(t["t_start"], unit="s", utc=True).dt.strftime("%Y-%m-%d %H:%M:%S"),
        "duration": t["duration_s"].map(lambda x: num(x, " s")), "requests": t["n_requests"].map(integer),
        "ok": [integer(ok.get(k, 0)) for k in key], "crashes": [integer(ncrash.get(k, 0)) for k in key],
        "drift lines": [integer(ndrift.get(k, 0)) for k in key], "missing files": t["missing"].replace("", "—"),
    }))
    crashed = t[[ncrash.get(k, 0) > 0 for k in key]].drop_duplicates("config")
    for _, tr in crashed.iterrows():
        lines = read_server_log(tr["path"], LOG_TAIL_LINES)
        if lines:
            doc.h(3, f"End of server.log: {tr['config']} trial {tr['trial']}")
            doc.code("\n".join(line[:300] for line in lines))


# --- command line -------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + error
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="mmchaos report", description="Write the report of a campaign (Markdown + one HTML file).")
    p.add_argument("results_dir", help="a campaign folder: results/<campaign>")
    p.add_argument("--baseline", help="configuration the workaround cost is measured against "
                                      "(default: the one without extra flags, else the first)")
    p.add_argument("--compare", metavar="OTHER_DIR",
                   help="a second campaign folder to compare with (e.g. after an upgrade)")
    p.add_argument("--out", metavar="DIR", help=f"where to write (default: RESULTS_DIR/{DEFAULT_OUT})")
    p.add_argument("--window", type=float, default=DEFAULT_WINDOW_S, help="attribution window in seconds (default 10)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    progress = None if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        res = write_report(a.results_dir, a.out, a.baseline, a.compare, window_s=a.window, progress=progress)
    except ReportError as e:
        print(f"mmchaos report: error: {e}", file=sys.stderr)
        return 2
    print(res.html)
    return 0


if __name__ == "__main__":
    sys.exit(main())
