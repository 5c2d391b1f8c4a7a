"""The panel's tabs in Locust's web UI: their titles and columns, and the rows they show (Locust's
``extended_tabs`` / ``extended_tables`` / ``extended_stats``; the UI renders every cell as text)."""

from __future__ import annotations

from .fault_form import rows_for_panel
from .live_state import RECENT_S, LiveState, clock
from .outcomes import CATEGORIES

TAB_VERDICT, TAB_EVENTS, TAB_OUTCOMES, TAB_SERVER, TAB_FAULTS = (
    "mmchaos-verdict",
    "mmchaos-events",
    "mmchaos-outcomes",
    "mmchaos-server",
    "mmchaos-faults",
)
TABS = [
    {"title": "mmchaos: verdict", "key": TAB_VERDICT},
    {"title": "mmchaos: events", "key": TAB_EVENTS},
    {"title": "mmchaos: outcomes", "key": TAB_OUTCOMES},
    {"title": "mmchaos: server", "key": TAB_SERVER},
    {"title": "mmchaos: faults", "key": TAB_FAULTS},
]
TABLES = [
    {
        "key": TAB_VERDICT,
        "structure": [
            {"key": "item", "title": "Item"},
            {"key": "state", "title": "State"},
            {"key": "detail", "title": "Detail"},
        ],
    },
    {
        "key": TAB_EVENTS,
        "structure": [
            {"key": "time", "title": "Time (since start)"},
            {"key": "event", "title": "Event"},
            {"key": "signature", "title": "Signature"},
            {"key": "source", "title": "Source"},
            {"key": "cause", "title": "Cause (the image the server named)"},
            {"key": "detail", "title": "Detail"},
        ],
    },
    {
        "key": TAB_OUTCOMES,
        "structure": [
            {"key": "kind", "title": "Kind"},
            {"key": "total", "title": "Total"},
            {"key": "ok", "title": "ok"},
            {"key": "c4xx", "title": "4xx"},
            {"key": "c503", "title": "503"},
            {"key": "c5xx", "title": "other 5xx"},
            {"key": "refused", "title": "refused"},
            {"key": "timeout", "title": "timeout"},
            {"key": "aborted", "title": "aborted"},
            {"key": "cut", "title": "cut at the end"},
            {"key": "other", "title": "other"},
            {"key": "last_error", "title": "Last error"},
        ],
    },
    {"key": TAB_SERVER, "structure": [{"key": "item", "title": "Item"}, {"key": "value", "title": "Value"}]},
    {
        "key": TAB_FAULTS,
        "structure": [
            {"key": "time", "title": "Time (since the first)"},
            {"key": "fault", "title": "Fault"},
            {"key": "source", "title": "Source"},
            {"key": "target", "title": "Target"},
            {"key": "outcome", "title": "Outcome"},
            {"key": "detail", "title": "Detail"},
        ],
    },
]
_COLUMN = {
    "ok": "ok",
    "4xx": "c4xx",
    "503": "c503",
    "5xx": "c5xx",
    "refused": "refused",
    "timeout": "timeout",
    "aborted": "aborted",
    "cut": "cut",
    "other": "other",
}
TIMELINE_LINK = "./mmchaos/timeline"


def tables(panel: LiveState, st: dict) -> list[dict]:
    """The rows of the four tabs (``extended_stats`` of /stats/requests), from ``panel.state(...)``."""
    t0 = panel.t_start or 0.0
    ev = [
        {
            "time": clock(e["t"]) + (f" (+{e['t'] - t0:.1f} s)" if panel.t_start else ""),
            "event": e["event"],
            "signature": e["signature"],
            "source": e["source"],
            "cause": e.get("cause") or "",
            "detail": e["detail"],
        }
        for e in st["events"]
    ]
    if not ev:
        ev = [
            {
                "time": clock(st["now"]),
                "event": "(none yet)",
                "detail": "no crash, drift or classified log "
                "line so far" + ("" if panel.server_log else "; pass --server-log to classify the server's log"),
            }
        ]
    out = []
    rows = list(st["outcomes"]["kinds"].items()) + [("all", st["outcomes"]["total"])]
    for kind, c in rows:
        r = {"kind": kind, "total": c["total"], **{_COLUMN[cat]: c[cat] for cat in CATEGORIES}}
        r["last_error"] = st["outcomes"]["last_error"].get(kind, "")
        out.append(r)
    return [
        {"key": TAB_VERDICT, "data": _verdict_rows(st)},
        {"key": TAB_EVENTS, "data": ev},
        {"key": TAB_OUTCOMES, "data": out},
        {"key": TAB_SERVER, "data": _server_rows(st)},
        {"key": TAB_FAULTS, "data": rows_for_panel(panel.fault_relay)},
    ]


def _verdict_rows(st: dict) -> list[dict]:
    v = st["verdict"]
    rows = [{"item": "verdict", "state": v["title"], "detail": "as a retrying client sees the server, so far"}]
    rows += [{"item": c["title"], "state": c["state"], "detail": c["evidence"]} for c in v["checks"]]
    rows += [
        {"item": f"gate {g['option'].replace('_', '-')}", "state": g["state"], "detail": g["text"]} for g in st["gates"]
    ]
    rows.append(
        {
            "item": "timeline",
            "state": "",
            "detail": f"health, drift, crashes and the mm-cache hit rate over "
            f"the run: open {TIMELINE_LINK} (also under Download Data)",
        }
    )
    return rows


def _server_rows(st: dict) -> list[dict]:
    h, now = st["health"], st["now"]
    rows = []

    def add(item, value):
        rows.append({"item": item, "value": value})

    if not h["watching"]:
        add("health", "not watched (--no-watch, or no host)")
    elif h["state"] is None:
        add("health", "no poll yet")
    else:
        add("health now", f"{h['state']} since {clock(h['since'])} ({now - h['since']:.1f} s)")
        add("health polls", f"{h['polls']} ({h['polls'] - h['polls_ok']} failed)")
    mm = st["mm_cache"]
    if mm["available"]:

        def pct(x):
            return "n/a (no queries)" if x is None else f"{100 * x:.1f}%"

        add("mm-cache hit rate, this run", pct(mm["run"]))
        add(f"mm-cache hit rate, last {RECENT_S:.0f} s", pct(mm["recent"]))
        add(
            "mm-cache hit rate, since server start",
            f"{pct(mm['cumulative'])} ({mm['hits']:.0f} hits / {mm['queries']:.0f} queries at {clock(mm['t'])})",
        )
        add("mm-cache metrics", ", ".join(mm["names"]))
    else:
        add("mm-cache hit rate", mm["text"])
    weights = {k[len("weight_") :]: v for k, v in st["options"].items() if k.startswith("weight_")}
    if weights:
        add("mix weights, this run", ", ".join(f"{k} {v}" for k, v in weights.items()))
    o = st["outcomes"]
    add("requests", f"{o['total']['total']} ({o['total']['ok']} ok), drift 503s: {o['drift_503']}")
    add(
        "outcome counts from",
        st["counts_source"] + (f" ({st['workers_reporting']} reporting)" if "worker" in st["counts_source"] else ""),
    )
    sl = st["server_log"]
    if sl["path"]:
        add(
            "server log",
            f"{sl['path']}: {sl['lines_read']} lines read, {sl['classified']} classified"
            + (f"; {sl['error']}" if sl["error"] else ""),
        )
    else:
        add("server log", "not given (--server-log PATH classifies crashes and drift from it)")
    for c in st["event_counts"]:
        add(f"events: {c['event']}" + (f" / {c['signature']}" if c["signature"] else ""), str(c["count"]))
    for s in reversed(h["segments"]):
        add(
            f"health {clock(s['from'])} → {clock(s['to'])}",
            f"{s['state']} ({s['polls']} polls, {s['to'] - s['from']:.1f} s)",
        )
    return rows
