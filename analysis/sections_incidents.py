"""The report's incidents: crashes, time to the first crash, what preceded each incident, drift, errors."""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import stats
from .document import Doc
from .formatting import ci_col, duration, integer, num, pct, pct_ci
from .results import CampaignResults
from .survival import median_survival

MAX_EVENT_ROWS = 60


def crashes(doc: Doc, c: CampaignResults, crash: pd.DataFrame, fig: bytes) -> None:
    doc.h(2, "Crashes")
    doc.p(
        "A crash is a server death detected by the harness (process exit, failed health checks or a hang). "
        "Rates count every crash (a trial can restart the server and crash again) over the exposure the server "
        "really had: hours of uptime (the load time while it was up: from a crash's detection to its next "
        "healthy /health is down time) and the requests it answered (not those refused while it was down or "
        "restarting). Requests: every request sent. The share of trials counts trials with at least one crash."
    )
    doc.table(
        pd.DataFrame(
            {
                "configuration": crash["config"].astype(str),
                "trials": crash["trials"].map(integer),
                "load": (crash["hours"] * 3600).map(duration),
                "up": (crash["uptime_hours"] * 3600).map(duration),
                "requests": crash["requests"].map(integer),
                "answered": crash["answered"].map(integer),
                "crashes": crash["crashes"].map(integer),
                "per 1,000 answered": ci_col(crash, "per_1k_answered"),
                "per hour of uptime": ci_col(crash, "per_hour_up"),
                "trials crashed": [f"{int(k)}/{int(n)}" for k, n in crash[["trials_crashed", "trials"]].to_numpy()],
                "share of trials crashed": ci_col(crash, "share_crashed", fmt=pct_ci),
            }
        ),
        caption="Crash rates with 95 % intervals",
    )
    doc.image("crash_rates.png", fig, "crash rates per configuration with intervals")
    sig = stats.crash_signatures(c)
    if len(sig):
        doc.table(
            sig.rename(columns={"config": "configuration", "chain": "chain of signatures", "trials": "in trials"}),
            caption="Crashes by their chain of log signatures, root first (a drift warning, then the "
            "assertion it led to), and how they were detected",
        )
    logs = stats.log_signatures(c)
    if len(logs):
        logs = logs.assign(
            example=logs["example"].astype(str).str.slice(0, 240),
            fatal=logs["fatal"].map({True: "fatal", False: "warning"}),
        )
        doc.table(logs.rename(columns={"config": "configuration"}), caption="Classified server-log lines")


def survival(doc, durations, curves, fig, configs) -> None:
    doc.h(2, "Time and requests to the first crash")
    doc.p(
        "Kaplan–Meier estimate of the share of trials still without a crash. Trials that ended without "
        "crashing are censored at their end (marked |): they say 'at least this long', not 'crashed here'."
    )
    doc.image("survival.png", fig, "Kaplan-Meier survival curves until first crash")
    rows = []
    for cfg in configs:
        if cfg not in curves:
            continue
        d = durations[durations["config"] == cfg]
        mt, mr = median_survival(curves[cfg]["time_s"]), median_survival(curves[cfg]["requests"])
        rows.append(
            {
                "configuration": cfg,
                "trials": len(d),
                "crashed": int(d["crashed"].sum()),
                "median time to first crash": duration(mt)
                if np.isfinite(mt)
                else f"not reached (over {duration(d['time_s'].max())})",
                "median requests to first crash": integer(mr)
                if np.isfinite(mr)
                else f"not reached (over {integer(d['requests'].max())})",
                "first crashes at": ", ".join(duration(x) for x in sorted(d.loc[d["crashed"], "time_s"])) or "—",
            }
        )
    doc.table(pd.DataFrame(rows))


def attribution(doc, events, summary, window_s) -> None:
    doc.h(2, "What caused each incident, and what was sent before it")
    doc.p(
        "The cause, in the server's own words: a drift line names the request whose image the engine missed (and the "
        "image's mm_hash); that image is followed back through the same server's life to the first request that "
        "carried it and failed after render (a post-render 4xx, a client hang-up, a timeout) since its last "
        "answered use. A crash takes the cause of the drift line that opened its chain. An incident without that "
        "evidence has no cause ('—'), and a pre-render case, which cannot poison, is never named one."
    )
    doc.p(
        f"Second, for every cache-drift line and every crash, the requests with images sent in the {window_s:g} s "
        "before it (for crashes: before the last healthy moment, up to detection). When the drift line names an "
        "mm_hash that matches a sent image, only requests with that same image count ('same image'); otherwise all "
        "image requests in the window do. 'background' is the same share for windows placed before random image "
        "requests of the configuration; lift = share of incidents / background. A kind with a high share and a "
        "lift well above 1 is what the incidents have in common — the likely trigger."
    )
    if not len(events):
        doc.p("No drift line and no crash was recorded: nothing to attribute.")
        return
    s = (
        summary[(summary["caused"] > 0) | (summary["share_of_events"] >= 0.2) | (summary["lift"] > 1.5)]
        if len(summary)
        else summary
    )
    if len(s):
        doc.table(
            pd.DataFrame(
                {
                    "configuration": s["config"].astype(str),
                    "incident": s["event"],
                    "kind": s["kind"],
                    "malformed case": s["case"],
                    "named cause of": [f"{int(a)}/{int(b)}" for a, b in s[["caused", "events"]].to_numpy()],
                    "matched by": s["match"].fillna("—"),
                    "incidents preceded": [
                        f"{int(a)}/{int(b)}" if a == a else "—" for a, b in s[["events_with", "events"]].to_numpy()
                    ],
                    "share": s["share_of_events"].map(pct),
                    "background": s["background_share"].map(pct),
                    "lift": s["lift"].map(lambda x: "∞" if np.isinf(x) else num(x)),
                }
            ),
            caption="Kinds and malformed cases: how many incidents they caused (the server's evidence), then how "
            "often they were seen before one (shown: a cause, share at least 20 % or lift above 1.5)",
        )
    shown = events.head(MAX_EVENT_ROWS)
    doc.table(
        pd.DataFrame(
            {
                "configuration": shown["config"].astype(str),
                "trial": shown["trial"],
                "incident": shown["event"],
                "signature": shown["signature"],
                "at": shown["t_rel"].map(duration),
                "cause": shown["cause"].fillna("—"),
                "mm_hash": shown["server_mm_hash"].fillna("—"),
                "image": shown["named_image"].fillna("—"),
                "matched by": shown["match"],
                "requests": shown["requests"],
                "sent before": shown["sent"].fillna("—").astype(str).str.slice(0, 300),
                "last one": shown["last_sent"].fillna("—"),
                "last one, s before": shown["last_before_s"].map(num),
            }
        ),
        caption=f"Incidents ({len(shown)} of {len(events)} shown)",
    )


def drift(doc, drift) -> None:
    doc.h(2, "Cache drift and retryable 503s")
    doc.p(
        "Drift lines: server-log lines classified as P0/P1 cache drift or cache miss (a signature whose name "
        "mentions drift, cache miss or a missing cached item). 503 share: requests answered with HTTP 503 — "
        "in versions that turn the miss into a retryable error, this is what clients see instead of a crash."
    )
    doc.table(
        pd.DataFrame(
            {
                "configuration": drift["config"].astype(str),
                "requests": drift["requests"].map(integer),
                "drift lines": drift["drift_events"].map(integer),
                "drift per 1,000 requests": ci_col(drift, "drift_per_1k"),
                "503 answers": drift["responses_503"].map(integer),
                "503 share": ci_col(drift, "share_503", fmt=pct_ci),
            }
        )
    )


def errors(doc, c) -> None:
    doc.h(2, "Errors")
    counts = stats.request_counts(c)
    outcome_cols = [col for col in counts.columns if col not in ("config", "kind", "n", "ok_share")]
    doc.table(
        counts.assign(
            config=counts["config"].astype(str),
            ok_share=counts["ok_share"].map(pct),
            n=counts["n"].map(integer),
            **{o: counts[o].map(integer) for o in outcome_cols},
        ).rename(columns={"config": "configuration", "ok_share": "ok share"}),
        caption="Requests by kind and outcome",
    )
    st = stats.errors_by_status(c)
    if len(st):
        doc.table(
            st.assign(config=st["config"].astype(str), n=st["n"].map(integer)).rename(
                columns={"config": "configuration", "status": "HTTP status"}
            ),
            caption="Requests that did not succeed, by HTTP status ('none': no answer)",
        )
    mc = stats.malformed_cases(c)
    if len(mc):
        doc.table(
            mc.assign(config=mc["config"].astype(str)).rename(
                columns={"config": "configuration", "expected_status": "expected", "as_expected": "as expected"}
            ),
            caption="Malformed requests per case: expected status versus what came back",
        )
    te = stats.top_errors(c)
    if len(te):
        doc.table(
            te.assign(
                config=te["config"].astype(str), error=te["error"].astype(str).str.slice(0, 300), n=te["n"].map(integer)
            ).rename(columns={"config": "configuration", "error": "error text"}),
            caption="Most frequent error texts (as received)",
        )
