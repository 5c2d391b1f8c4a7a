"""The report's opening: what was measured, the summary table, the plain-words findings and the verdicts."""

from __future__ import annotations

import datetime as dt

import pandas as pd

from mmchaos import cause_rule
from mmchaos.verdict_rule import CHECKS

from . import stats
from .attribution import MIN_LIFT_EVENTS, PRE_RENDER_KINDS, SAME_IMAGE
from .document import Doc
from .formatting import by_config, ci, duration, integer, num, pct, pct_ci
from .results import CampaignResults


def intro(doc: Doc, c: CampaignResults, baseline: str, window_s: float, compared: bool) -> None:
    tr = c.trials
    span = [pd.to_datetime(x, unit="s", utc=True) for x in (tr["t_start"].min(), tr["t_end"].max())]
    doc.p(
        f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC from {c.path}"
        + (" (compared with a second campaign; configurations are named campaign/config)" if compared else "")
        + f". {len(c.configs)} configuration(s), {len(tr)} trial(s), {len(c.requests):,} requests, "
        f"{duration(tr['duration_s'].sum())} of load"
        + (f", run between {span[0]:%Y-%m-%d %H:%M} and {span[1]:%Y-%m-%d %H:%M} UTC." if pd.notna(span[0]) else ".")
    )


def explanation(doc: Doc, c: CampaignResults, baseline: str, window_s: float) -> None:
    doc.p(
        "What this measures: a vLLM server serving a multimodal embedding model is driven with a realistic mix of "
        "requests plus malformed ones that can leave the multi-modal processor cache of the API server (P0) and the "
        "engine core (P1) out of step. A later request with the same image then misses in P1 (cache drift); "
        "depending on the version this kills the server or returns a retryable 503. Each configuration (vLLM "
        "version × flags) was run for several trials; this report counts crashes, drift, errors, latency and "
        "throughput per configuration, says which requests preceded each incident, and judges each configuration "
        "by the bug report's verification step as a client that retries sees it: fails (a crash, or failures no "
        "retry cured), survives with retryable errors (drift or failed first attempts, all cured by retries), or "
        "clean."
    )
    doc.note(
        "Intervals are 95 %: exact Poisson (Garwood) for rates, Wilson for shares of trials, bootstrap for latency "
        "percentiles and cost ratios, Kaplan–Meier (log-log Greenwood) for survival. "
        f"Cost is relative to the baseline configuration {baseline!r}. Attribution window: {window_s:g} s."
    )
    if c.warnings:
        doc.p("Notes from loading the results:")
        doc.bullets(c.warnings)


# the one crash rate the report leads with: per hour the server was up and taking load (a restart's down time is no
# exposure), as the crash-hazard section and `mmchaos predict` count it
RATE = "crashes per hour of uptime"


def cards(doc, c, verdict, crash, cost, baseline, events=None) -> None:
    """The first screen: per configuration its verdict, why in one line, its crashes at the one rate and the routes
    they came through, its cost against the baseline, and where its first crash is with the command that shrinks
    it."""
    v, cr = by_config(verdict), by_config(crash)
    cst = stats.pooled_cost(cost)
    trials = c.trials.set_index(["config", "trial"])
    out = []
    for cfg in c.configs:
        r = cr[cfg]
        lines = [_reason(v[cfg], r)]
        if r["crashes"]:
            lines.append(
                f"{int(r['crashes'])} crash(es) in {int(r['trials'])} trial(s): {num(r['per_hour_up'])} {RATE} "
                f"[{num(r['per_hour_up_lo'])}, {num(r['per_hour_up_hi'])}]"
            )
        else:
            lines.append(f"no crash in {int(r['trials'])} trial(s): at most {num(r['per_hour_up_hi'])} {RATE} (95 %)")
        if events is not None and (through := _through(events, cfg)):
            lines.append(through)
        if cfg == baseline:
            lines.append("the baseline the costs are measured against")
        elif cfg in cst.index:
            k = cst.loc[cfg]
            lines.append(
                f"cost: latency p50 {num(k['p50_ratio'])}×, throughput {num(k['throughput_ratio'])}× {baseline}'s"
            )
        first = c.crashes[c.crashes["config"] == cfg].sort_values("t_detected").head(1)
        if len(first) and (cfg, first["trial"].iloc[0]) in trials.index:
            folder = trials.loc[(cfg, first["trial"].iloc[0]), "path"]
            lines.append(f"shrink its first crash: mmchaos minimize {folder}")
        out.append((cfg, v[cfg]["title"], lines))
    doc.cards(out)


def _through(events: pd.DataFrame, cfg: str) -> str | None:
    """The routes of the requests that poisoned the images its crashes missed (a poison on one route kills the
    server through any other), where the server's log named them."""
    e = events[(events["event"] == "crash") & (events["config"] == cfg)]
    routes = e["cause_endpoint"].dropna().value_counts() if "cause_endpoint" in e else pd.Series(dtype=int)
    if not len(routes):
        return None
    return "crashed through " + ", ".join(f"{route} ({n})" for route, n in routes.items()) + ": the poison's route"


def _reason(v, r) -> str:
    """The verdict's one-line reason: what failed, or what was seen."""
    said = _failed(v, r)
    if said:
        return "; ".join(said)
    return "every check passed" if not v["not_exercised"] else f"not exercised: {', '.join(v['not_exercised'])}"


def summary(doc, c, verdict, crash, drift, retried, lat, tput, cost, attribution, baseline) -> None:
    doc.h(2, "Summary")
    v, cr, dr, tp, rt = by_config(verdict), by_config(crash), by_config(drift), by_config(tput), by_config(retried)
    pooled = lat[lat["kind"] == stats.ALL_VALID].set_index("config")
    cst = stats.pooled_cost(cost)
    rows = []
    for cfg in c.configs:
        trials = c.trials[c.trials["config"] == cfg]
        status = ", ".join(f"{k} {n}" for k, n in trials["status"].value_counts().items())
        rows.append(
            {
                "configuration": cfg,
                "verdict": v[cfg]["title"],
                "trials": f"{len(trials)} ({status})",
                "requests": integer(trials["n_requests"].sum()),
                "valid ok, 1st attempt": pct(rt[cfg]["first_ok_share"]),
                "valid ok, after retries": pct(rt[cfg]["final_ok_share"]),
                "crashes": integer(cr[cfg]["crashes"]),
                RATE: ci(cr[cfg]["per_hour_up"], cr[cfg]["per_hour_up_lo"], cr[cfg]["per_hour_up_hi"]),
                "trials crashed": pct_ci(*cr[cfg][["share_crashed", "share_crashed_lo", "share_crashed_hi"]]),
                "drift lines": integer(dr[cfg]["drift_events"]),
                "503 share": pct(dr[cfg]["share_503"]),
                "p50 / p95 ms (valid)": (
                    f"{num(pooled.loc[cfg, 'p50'])} / {num(pooled.loc[cfg, 'p95'])}" if cfg in pooled.index else "—"
                ),
                "ok / s": num(tp[cfg]["ok_per_s"]),
                f"p50 vs {baseline}": (num(cst.loc[cfg, "p50_ratio"], "×") if cfg in cst.index else "—"),
            }
        )
    doc.table(pd.DataFrame(rows))
    doc.p("In plain words:")
    doc.bullets([finding(cfg, v[cfg], cr[cfg], dr[cfg], attribution, cst, baseline) for cfg in c.configs])


def _failed(v, cr) -> list[str]:
    """The checks a configuration failed, said as what happened: "the server crashed in 2 of 2 trial(s)"."""
    by_title = {c.title: name for name, c in CHECKS.items()}
    failed = [
        by_title[t] for line in v["evidence"] if ": failed" in line and (t := line.split(": failed", 1)[0]) in by_title
    ]
    trials = int(cr["trials"])
    crashed = round(float(cr.get("share_crashed", 0) or 0) * trials)
    return [
        f"the server crashed in {crashed} of {trials} trial(s)" if n == "stays_up" and crashed else CHECKS[n].failed
        for n in failed
    ]


def finding(cfg, v, cr, dr, attribution, cst, baseline) -> str:
    said = _failed(v, cr)
    # what failed, said as what happened: "fails — the server crashed in 2 of 2 trials"
    parts = [
        f"{cfg}: {v['title']}"
        + (f" — {'; '.join(said)}" if said else "")
        + (f" (not exercised: {', '.join(v['not_exercised'])})" if v["not_exercised"] else "")
    ]
    if cr["crashes"]:
        parts.append(
            f"{int(cr['crashes'])} crash(es) in {int(cr['trials'])} trial(s), "
            f"{num(cr['per_hour_up'])} {RATE} [{num(cr['per_hour_up_lo'])}, {num(cr['per_hour_up_hi'])}]"
        )
    else:
        parts.append(f"no crash in {int(cr['trials'])} trial(s) (at most {num(cr['per_hour_up_hi'])} {RATE} at 95 %)")
    if dr["drift_events"]:
        parts.append(f"{int(dr['drift_events'])} cache-drift line(s)")
    a = attribution[(attribution["config"] == cfg)] if len(attribution) else attribution
    for event in ("crash", "drift"):
        what_events = "crashes" if event == "crash" else "drift lines"
        mine = a[a["event"] == event] if len(a) else a
        caused = mine[mine["caused"] > 0] if len(mine) else mine
        if len(caused):  # the server named the image: its first post-render failure is the cause
            # the first cause, and a race of first uses beside it (it needs no failure: said whenever met)
            said_rows = [caused.iloc[0]] + [t for _, t in caused.iloc[1:].iterrows() if t["kind"] == cause_rule.AT_ONCE]
            for t in said_rows:
                parts.append(
                    f"{int(t['caused'])} of {int(t['events'])} {what_events} caused by "
                    + (
                        f"the image's first two uses at once, one of them {t['case']} (no request had failed: "
                        "the API server rendered both before the engine got the one with the image)"
                        if t["kind"] == cause_rule.AT_ONCE
                        else f"{_what(t)} (the image the server named had failed after render there first)"
                    )
                )
            continue
        # no evidence: a window statistic names a case only from enough incidents, and never one that cannot poison
        top = (
            mine[
                (mine["share_of_events"] >= 0.5)
                & (mine["lift"] > 1.5)
                & (mine["events"] >= MIN_LIFT_EVENTS)
                & ~mine["kind"].isin(PRE_RENDER_KINDS)
            ]
            if len(mine)
            else mine
        )
        if len(top):
            t = top.iloc[0]
            how = "with the same image" if t["match"] == SAME_IMAGE else "(any image)"
            parts.append(
                f"{what_events} were preceded {how} by {_what(t)} in "
                f"{t['share_of_events']:.0%} of cases vs {t['background_share']:.0%} of random windows"
            )
    if cfg in cst.index and cfg != baseline:
        r = cst.loc[cfg]
        parts.append(f"latency p50 {num(r['p50_ratio'])}× and throughput {num(r['throughput_ratio'])}× {baseline}'s")
    return "; ".join(parts) + "."


def _what(t) -> str:
    return t["kind"] + ("" if t["case"] == "—" else f"/{t['case']}")


def verdicts(doc: Doc, verdict: pd.DataFrame) -> None:
    doc.h(2, "Verdict per configuration")
    doc.p(
        "The bug report's verification step: send the poison request (expect 400), then the same image in a valid "
        "request; the bad request must fail alone, the server must not log the cache drift or die, /health must stay "
        "200, and normal requests must keep succeeding. Judged as the client that retries sees it (every attempt is "
        "recorded; requests cut by the end of a run are not counted): fails — a crash, a failed /health poll, or a "
        "failure no retry cured; survives with retryable errors — cache drift or failed first attempts, all cured; "
        "clean — none of these. A check the run could not exercise is named so, and is not a failure. A CI job can "
        "gate on these: mmchaos report RESULTS --expect CONFIG=fails|retryable|clean."
    )
    for _, row in verdict.iterrows():
        doc.h(3, f"{row['config']}: {row['title']}")
        doc.bullets(row["evidence"])
