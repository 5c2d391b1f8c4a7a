"""The report's performance: latency, throughput, the cost of each workaround, timelines per trial."""

from __future__ import annotations

import pandas as pd

from .formatting import ci_col, integer, num


def latency(doc, lat, fig) -> None:
    doc.h(2, "Latency")
    doc.p(
        "Latency of successful requests only (a failed request's latency says little); an open-loop request's "
        "from when it was due, its schedule lag included. Percentiles use linear interpolation; brackets are 95 % "
        "bootstrap intervals."
    )
    doc.image("latency.png", fig, "latency ECDF per kind and configuration")
    if len(lat):
        doc.table(
            pd.DataFrame(
                {
                    "configuration": lat["config"],
                    "kind": lat["kind"],
                    "n": lat["n"].map(integer),
                    **{f"p{p} ms": ci_col(lat, f"p{p}") for p in (50, 90, 95, 99)},
                }
            ),
            caption="Latency percentiles (ms) of successful requests",
        )


def throughput(doc, tput, fig) -> None:
    doc.h(2, "Throughput")
    doc.p(
        "Successful requests per second of load (load time includes time the server was down). "
        "'mean over trials' has a bootstrap interval over trials."
    )
    doc.table(
        pd.DataFrame(
            {
                "configuration": tput["config"],
                "trials": tput["trials"],
                "ok requests": tput["ok"].map(integer),
                "sent / s": tput["sent_per_s"].map(num),
                "ok / s (pooled)": tput["ok_per_s"].map(num),
                "ok / s (mean over trials)": ci_col(
                    tput.rename(columns={"trial_mean_ok_per_s": "m", "trial_mean_lo": "m_lo", "trial_mean_hi": "m_hi"}),
                    "m",
                ),
            }
        )
    )
    doc.image("throughput.png", fig, "throughput over time per configuration")


def cost(doc, cost, baseline) -> None:
    doc.h(2, "Cost of the workaround")
    doc.p(
        f"Each configuration relative to the baseline {baseline!r}: ratio of p50 and p95 latency of successful "
        "requests (bootstrap over requests) and of throughput (bootstrap over trials). 1.00× is the same; "
        "above 1 means slower (latency) or more (throughput)."
    )
    if not len(cost):
        doc.p("Not enough successful requests to compare.")
        return
    doc.table(
        pd.DataFrame(
            {
                "configuration": cost["config"],
                "kind": cost["kind"],
                "p50 ms": cost["p50_ms"].map(num),
                "p50 ratio": ci_col(cost, "p50_ratio", "×"),
                "p95 ms": cost["p95_ms"].map(num),
                "p95 ratio": ci_col(cost, "p95_ratio", "×"),
                "throughput ratio": ci_col(cost, "throughput_ratio", "×"),
            }
        )
    )


def timelines(doc, timeline_figs) -> None:
    doc.h(2, "Timelines")
    doc.p(
        "Per trial: successful requests per second (green), unexpected failures per second (red; malformed "
        "requests answered as expected and deliberate aborts are not counted), crashes (dashed), failed /health "
        "polls (black ticks), logged cache drift (orange triangles), faults injected (purple lines labelled with "
        "their kind, shaded while they last) and requests running on the server from /metrics (blue, right axis)."
    )
    for i, (cfg, (png, hidden)) in enumerate(timeline_figs.items()):
        doc.h(3, cfg)
        doc.image(f"timeline_{i:02d}.png", png, f"timeline of the trials of {cfg}")
        if hidden:
            doc.note(f"Not drawn: trials {', '.join(map(str, hidden))}.")
