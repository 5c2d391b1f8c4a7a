"""Open-loop trials in the report: the rate asked against the rate sent, how late the generator sent, and the
latency a caller saw (from the schedule) beside the latency as sent.

A trial is open loop when its workload has a rate (``[workload] rate``); its rows carry ``t_sched`` and
``sched_lag_ms`` (mmchaos.schema). A request's latency from the schedule is ``sched_lag_ms + latency_ms``: what a
caller whose request arrived at ``t_sched`` waited. The report's latency tables use it for open-loop rows
(stats._ok_latency_groups), so a generator that fell behind cannot hide the server's slowness (coordinated
omission).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from mmchaos import arrivals, schema

from .formatting import integer, num
from .results import CampaignResults


def latency_from_schedule(requests: pd.DataFrame) -> pd.Series:
    """Each row's latency as its caller saw it: from when it was due (open loop), else from when it was sent."""
    if "sched_lag_ms" not in requests.columns:
        return requests["latency_ms"]
    return requests["latency_ms"] + requests["sched_lag_ms"].fillna(0.0)


def table(c: CampaignResults) -> pd.DataFrame:
    """Per open-loop configuration and asked rate (a sweep may vary it): asked and sent rates, schedule lag,
    latency of successful valid requests as sent and from the schedule."""
    t, r = c.trials, c.requests
    rates = t["workload"].map(lambda w: float(json.loads(w).get("rate") or 0))
    if not (rates > 0).any() or "sched_lag_ms" not in r.columns:
        return pd.DataFrame()
    rate_of = {(str(cf), int(tr)): x for cf, tr, x in zip(t["config"], t["trial"], rates)}
    r_rate = pd.Series([rate_of.get((str(cf), int(tr)), 0.0) for cf, tr in zip(r["config"], r["trial"])], index=r.index)
    rows = []
    for (cfg, rate), trials in t[rates > 0].groupby([t["config"].astype(str), rates[rates > 0]]):
        sel = r[(r["config"].astype(str) == cfg) & (r_rate == rate)]
        sched = sel[sel["sched_lag_ms"].notna()]
        lag = sched["sched_lag_ms"].to_numpy()
        ok = sel[(sel["outcome"] == schema.OK) & sel["kind"].isin(schema.VALID_KINDS)]
        sent, due, span = _sent_due_span(sched, rate)
        rows.append(
            {
                "config": cfg,
                "rate": rate,
                "arrival": json.loads(trials.iloc[0]["workload"]).get("arrival", "poisson"),
                "trials": len(trials),
                "scheduled": sent,
                "sent_per_s": sent / span if span > 0 else None,
                "held": arrivals.held(sent, round(due)),
                "lag_p50": _q(lag, 0.5),
                "lag_p99": _q(lag, 0.99),
                "lag_max": float(lag.max()) if len(lag) else None,
                "p50_sent": _q(ok["latency_ms"].to_numpy(), 0.5),
                "p99_sent": _q(ok["latency_ms"].to_numpy(), 0.99),
                "p50_sched": _q(latency_from_schedule(ok).to_numpy(), 0.5),
                "p99_sched": _q(latency_from_schedule(ok).to_numpy(), 0.99),
            }
        )
    return pd.DataFrame(rows)


def _sent_due_span(sched: pd.DataFrame, rate: float) -> tuple[int, float, float]:
    """Requests sent, requests due and seconds of load, from the rows of the arrivals sent. Every arrival up to
    the last one sent was due; after it, a Locust process that fell behind still had arrivals coming while it sent
    late, for as long as it was behind at its last send (its lane's rate is the rate over its lanes)."""
    sent, due, span = 0, 0.0, 0.0
    for _, trial in sched.groupby(["config", "trial"], observed=True):
        lanes = trial.groupby("worker", observed=True)
        for _, w in lanes:
            behind = max(0.0, float(w["t_start"].max() - w["t_sched"].max()))
            sent += len(w)
            due += len(w) + behind * rate / lanes.ngroups
        span += float(trial["t_start"].max() - trial["t_sched"].min())
    return sent, due, span


def _q(x: np.ndarray, q: float) -> float | None:
    return float(np.quantile(x, q)) if len(x) else None


def section(doc, c: CampaignResults) -> None:
    ol = table(c)
    if not len(ol):
        return
    doc.h(2, "Open-loop arrivals")
    doc.p(
        "Requests were sent at the times of an arrival process (rate per second asked), by users sized for it. "
        "'sent / s' counts the arrivals sent per second of load (the server's downtime included); 'sent / due' "
        "is the share of the arrivals due that were sent (those a process had yet to send when it stopped "
        "counted from how far behind it was); under "
        f"{arrivals.DEFAULT_MIN_RATE_RATIO:.0%} the rate was not held: the generator, or a hung server "
        "holding every user, fell behind. The schedule lag is how late an arrival was sent; latency 'from the "
        "schedule' adds it (what a caller waited), and the report's other latency tables use it."
    )
    held = ol["held"].map(
        lambda v: (
            "—"
            if v is None or pd.isna(v)
            else f"{v:.1%}" + ("" if v >= arrivals.DEFAULT_MIN_RATE_RATIO else " (not held)")
        )
    )
    doc.table(
        pd.DataFrame(
            {
                "configuration": ol["config"],
                "asked / s": ol["rate"].map(num),
                "arrival": ol["arrival"],
                "trials": ol["trials"],
                "sent": ol["scheduled"].map(integer),
                "sent / s": ol["sent_per_s"].map(num),
                "sent / due": held,
                "lag p50 ms": ol["lag_p50"].map(num),
                "lag p99 ms": ol["lag_p99"].map(num),
                "lag max ms": ol["lag_max"].map(num),
                "p50 ms as sent": ol["p50_sent"].map(num),
                "p50 ms from schedule": ol["p50_sched"].map(num),
                "p99 ms as sent": ol["p99_sent"].map(num),
                "p99 ms from schedule": ol["p99_sched"].map(num),
            }
        ),
        caption="Open loop: asked and sent rates, schedule lag and latency of successful valid requests",
    )
